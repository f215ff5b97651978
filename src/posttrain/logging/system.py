"""CPU and GPU memory and utilisation, sampled into the metrics of each step.

CPU numbers come from psutil (a Ray dependency): system-wide utilisation since the previous
sample, system memory in use, and this (controller) process's resident memory. GPU numbers
come from NVML (the `nvidia-ml-py` package, also what `torch.cuda.utilization` uses), which
reads every process's usage without creating a CUDA context in the controller; without NVML,
`torch.cuda.mem_get_info` gives memory only. Nothing GPU-related is imported on a CPU machine.
"""

from __future__ import annotations

from typing import Any

GIB = 1024**3


def cpu_metrics(psutil: Any, process: Any) -> dict[str, float]:
    memory = psutil.virtual_memory()
    return {
        "system/cpu_percent": float(psutil.cpu_percent(interval=None)),
        "system/cpu_memory_used_gib": (memory.total - memory.available) / GIB,
        "system/cpu_memory_percent": float(memory.percent),
        "system/process_rss_gib": process.memory_info().rss / GIB,
    }


def nvml_metrics(nvml: Any) -> dict[str, float]:
    """Per visible GPU i: system/gpu{i}_memory_used_gib, _memory_percent and _util_percent."""
    out: dict[str, float] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        out[f"system/gpu{i}_memory_used_gib"] = memory.used / GIB
        out[f"system/gpu{i}_memory_percent"] = 100.0 * memory.used / memory.total
        out[f"system/gpu{i}_util_percent"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    return out


def torch_cuda_memory_metrics() -> dict[str, float]:
    import torch

    out: dict[str, float] = {}
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        out[f"system/gpu{i}_memory_used_gib"] = (total - free) / GIB
        out[f"system/gpu{i}_memory_percent"] = 100.0 * (total - free) / total
    return out


class SystemMonitor:
    """`sample()` -> a dict of `system/*` metrics; GPU ones only where CUDA is present."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.process = psutil.Process()
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        self.nvml: Any = None
        self.cuda = self._cuda_available()
        if self.cuda:
            self.nvml = self._init_nvml()

    @staticmethod
    def _cuda_available() -> bool:
        import torch

        return torch.cuda.is_available()

    @staticmethod
    def _init_nvml() -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml
        except Exception:  # noqa: BLE001 - NVML missing or unusable: fall back to torch.cuda
            return None

    def sample(self) -> dict[str, float]:
        metrics = cpu_metrics(self.psutil, self.process)
        if self.nvml is not None:
            metrics.update(nvml_metrics(self.nvml))
        elif self.cuda:
            metrics.update(torch_cuda_memory_metrics())
        return metrics
