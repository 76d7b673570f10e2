"""What this machine offers the cluster: visible GPUs and usable CPU cores."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from launcher import LaunchError


@dataclass(frozen=True)
class Devices:
    """GPU ids engines may use (empty: place engines on CPU cores) and CPU core ids."""

    gpus: list[int]
    cpus: list[int]

    def describe(self) -> str:
        if self.gpus:
            return f"{len(self.gpus)} GPU(s): {format_ids(self.gpus)}"
        return f"no GPU visible; CPU cores {format_ids(self.cpus)}"


def detect_devices() -> Devices:
    """GPUs from ``CUDA_VISIBLE_DEVICES`` when set (empty: none), else ``nvidia-smi -L``."""
    return Devices(gpus=_visible_gpus(), cpus=sorted(os.sched_getaffinity(0)))


def _visible_gpus() -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if not all(v.isdigit() for v in ids):
            raise LaunchError(f"CUDA_VISIBLE_DEVICES={visible!r}: the launcher needs GPU "
                              "indices (0,1,...), not UUIDs")
        return [int(v) for v in ids]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [i for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def format_ids(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (the syntax of VLLM_CPU_OMP_THREADS_BIND)."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
