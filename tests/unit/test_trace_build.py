"""Trace builder pieces that need no engine: resuming checks the header's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_bench.trace.build import Settings, open_trace
from kernels_bench.trace.format import FORMAT, VERSION, Header, read_records
from kernels_bench.trace.workflows import WORKFLOWS


def _header(max_tokens: int, problems: int = 10) -> Header:
    s = Settings("math", problems, 0, max_tokens, 8, 10.0)
    return Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS["math"],
                  settings=s.header_settings(), sources=[], command="x")


def test_open_trace_creates_then_resumes_and_refuses_other_settings(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl.gz"
    assert open_trace(out, _header(512)) == set()
    assert read_records(out)[0].settings["max_tokens"] == 512
    assert open_trace(out, _header(512, problems=100)) == set()  # more problems: fine
    with pytest.raises(SystemExit, match="different settings"):
        open_trace(out, _header(256))
