"""Console progress, JSONL and TensorBoard metrics, timers and plots."""

from posttrain.logging.loggers import MetricsLogger
from posttrain.logging.timer import Timer

__all__ = ["MetricsLogger", "Timer"]
