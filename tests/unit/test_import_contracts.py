"""The import contracts of pyproject.toml (``[tool.importlinter]``) hold, and they bite.

``lint-imports`` is import-linter's own command; a broken contract fails this test with
its report. The second test plants an upward import, a sibling cycle and a product
module importing the lab in a copy of the packages, so a contract file that silently
checks nothing would fail here too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = ("kernels_bench", "launcher", "router", "engine_ext", "scheduler_patches")
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=cwd, text=True,
                          capture_output=True, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def needs_import_linter() -> None:
    if not LINT.exists():
        pytest.fail(f"{LINT} is missing: the dev dependencies (make setup) install it")


def test_contracts_are_kept() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_and_a_cycle_break_them(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "router" / "types.py").open("a") as f:
        f.write("\nfrom kernels_bench.lab.trace import answers  # noqa: E402\n")
    with (tmp_path / "router" / "state" / "kv_hash.py").open("a") as f:
        f.write("\nfrom router.state import view  # noqa: E402\n")
    with (tmp_path / "kernels_bench" / "lib" / "model_map.py").open("a") as f:
        f.write("\nfrom kernels_bench.lab.replay import spec  # noqa: E402\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    out = result.stdout
    assert "Top-level layers" in out and "router.types -> kernels_bench.lab.trace.answers" in out
    assert "cycles are allowed in router.state" in out and ".kv_hash -> .view" in out
    assert "The product never imports the lab" in out
    assert "kernels_bench.lib.model_map -> kernels_bench.lab.replay.spec" in out
