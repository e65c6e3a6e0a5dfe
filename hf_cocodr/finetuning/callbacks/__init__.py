from .anchor import StartingPointAnchor
from .averaging import WeightAveraging
from .deadline import WallClockDeadline
from .kmeans import KMeansClusteringCallback
from .negatives import HardNegativeRefreshCallback
from .throughput import GpuUtilization, ThroughputMeter

__all__ = [
    "GpuUtilization",
    "HardNegativeRefreshCallback",
    "KMeansClusteringCallback",
    "StartingPointAnchor",
    "ThroughputMeter",
    "WallClockDeadline",
    "WeightAveraging",
]
