"""Mean time of a call: eager (each kernel launched from Python) or, on CUDA, replayed as a
CUDA graph (what vLLM does for decode steps). CUDA times come from CUDA events, CPU times
from ``time.perf_counter``; every timing follows ``WARMUP`` untimed calls."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

WARMUP = 3
"""Untimed calls before each timing (allocator, kernel selection, caches)."""


def eager_ms(fn: Callable[[], object], repeats: int, cuda: bool) -> float:
    """Mean ms of ``fn()`` over ``repeats`` calls after ``WARMUP``."""
    for _ in range(WARMUP):
        fn()
    return _mean_ms(fn, repeats, cuda)


def graph_ms(fn: Callable[[], object], repeats: int) -> float:
    """Mean ms of one replay of ``fn`` captured as a CUDA graph, over ``repeats`` replays
    (warmed up on a side stream before capture, as torch requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(WARMUP):
        graph.replay()
    ms = _mean_ms(graph.replay, repeats, cuda=True)
    del graph
    return ms


def _mean_ms(fn: Callable[[], object], repeats: int, cuda: bool) -> float:
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1000 * (time.perf_counter() - t0) / repeats
