"""The product runs without the lab: every module of engine_ext, scheduler_patches, router,
launcher and kernels_bench (but ``kernels_bench.lab``) imports, and ``python -m launcher
--help`` and ``python -m kernels_bench --help`` run, in a process whose import system
refuses ``kernels_bench.lab`` and the third-party packages of the ``lab`` extra
(pyproject.toml). A failure names the product module that needed the lab."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("engine_ext", "scheduler_patches", "router", "launcher", "kernels_bench")

CHILD = r'''
import contextlib, importlib, importlib.abc, io, json, pkgutil, runpy, sys

REFUSED = tuple(sys.argv[1].split(","))
PRODUCT = tuple(sys.argv[2].split(","))


class RefuseLab(importlib.abc.MetaPathFinder):
    """Stands in for the finders of sys.meta_path: a refused package (or a module in it) is
    found by none, as if it were not installed (an import raises ModuleNotFoundError,
    ``importlib.util.find_spec`` answers None); any other name goes to those finders."""

    def __init__(self, finders):
        self.finders = finders

    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in REFUSED):
            return None
        for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                return spec
        return None

    def find_distributions(self, *args, **kwargs):
        for finder in self.finders:
            if hasattr(finder, "find_distributions"):
                yield from finder.find_distributions(*args, **kwargs)

    def invalidate_caches(self):
        for finder in self.finders:
            if hasattr(finder, "invalidate_caches"):
                finder.invalidate_caches()


sys.meta_path[:] = [RefuseLab(list(sys.meta_path))]
failures, refused = {}, []


def error(e):
    return f"{type(e).__name__}: {e}"


def walk(package):
    """Import ``package`` and every module below it but the lab, recording failures."""
    try:
        module = importlib.import_module(package)
    except Exception as e:
        failures[package] = error(e)
        return
    for info in pkgutil.iter_modules(getattr(module, "__path__", []), package + "."):
        if info.name == "kernels_bench.lab":
            continue
        if info.ispkg:
            walk(info.name)
            continue
        try:
            importlib.import_module(info.name)
        except Exception as e:
            failures[info.name] = error(e)


for name in REFUSED:  # the refusal bites
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        refused.append(name)
for package in PRODUCT:
    walk(package)
helps = {}
for command in ("launcher", "kernels_bench"):
    sys.argv = [command, "--help"]
    out, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(command, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code or 0
    except Exception as e:
        code = error(e)
    helps[command] = {"code": code, "text": out.getvalue()}
print(json.dumps({"refused": refused, "failures": failures, "helps": helps}))
'''


def lab_packages() -> list[str]:
    """Import names of the ``lab`` extra's distributions (``reasoning-gym`` ->
    ``reasoning_gym``)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["lab"]
    return [re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].replace("-", "_") for req in extra]


def test_the_product_imports_and_helps_without_the_lab() -> None:
    refused = ["kernels_bench.lab", *lab_packages()]
    r = subprocess.run([sys.executable, "-c", CHILD, ",".join(refused), ",".join(PRODUCT)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["refused"] == refused, "the finder let a lab package through"
    assert not got["failures"], "product modules that needed the lab (or failed):\n" + "\n".join(
        f"  {module}: {why}" for module, why in sorted(got["failures"].items()))
    for command, run in got["helps"].items():
        assert run["code"] == 0, f"python -m {command} --help without the lab: {run['code']}"
    assert "usage" in got["helps"]["launcher"]["text"]
    assert re.search(r"^lab commands:\n  trace ", got["helps"]["kernels_bench"]["text"], re.M)
