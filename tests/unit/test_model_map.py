"""The served -> trace model map (``--model-map``) of the engine profile and the replays."""

from __future__ import annotations

import pytest

from kernels_bench.lib.model_map import ModelMapError, parse_model_map, resolve_model_map


def test_model_map_parsing_and_resolution() -> None:
    given = parse_model_map(["a=Qwen-Small, b=qwen-large", "c=x"])
    assert given == {"a": "Qwen-Small", "b": "qwen-large", "c": "x"}
    trace = ["qwen-small", "qwen-large", "x", "same"]
    assert resolve_model_map(["a", "b", "c", "same"], given, trace) == {
        "a": "qwen-small", "b": "qwen-large", "c": "x", "same": "same"}


@pytest.mark.parametrize("items, fragment", [
    (["a"], "expected SERVED=TRACE_MODEL"),
    (["a=x,a=y"], "mapped twice"),
    (["=x"], "expected SERVED=TRACE_MODEL"),
])
def test_model_map_syntax_errors(items: list[str], fragment: str) -> None:
    with pytest.raises(ModelMapError, match=fragment):
        parse_model_map(items)


def test_model_map_resolution_errors() -> None:
    with pytest.raises(ModelMapError, match="does not serve"):
        resolve_model_map(["a"], {"z": "m"}, ["m"])
    with pytest.raises(ModelMapError, match="mapped to 'nope'"):
        resolve_model_map(["a"], {"a": "nope"}, ["m"])
    with pytest.raises(ModelMapError, match="'b' is not a model of the trace; map it"):
        resolve_model_map(["a", "b"], {"a": "m"}, ["m"])
    with pytest.raises(ModelMapError, match="not a model of the trace"):  # ambiguous spelling
        resolve_model_map(["a"], {"a": "MM"}, ["Mm", "mM"])
