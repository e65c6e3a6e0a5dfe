from .deadline import WallClockDeadline
from .kmeans import KMeansClusteringCallback
from .negatives import HardNegativeRefreshCallback

__all__ = ["HardNegativeRefreshCallback", "KMeansClusteringCallback", "WallClockDeadline"]
