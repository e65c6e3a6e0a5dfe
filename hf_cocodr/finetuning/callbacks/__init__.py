from .deadline import WallClockDeadline
from .kmeans import KMeansClusteringCallback
from .negatives import HardNegativeRefreshCallback
from .throughput import GpuUtilization, ThroughputMeter

__all__ = [
    "GpuUtilization",
    "HardNegativeRefreshCallback",
    "KMeansClusteringCallback",
    "ThroughputMeter",
    "WallClockDeadline",
]
