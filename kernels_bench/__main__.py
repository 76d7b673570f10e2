"""``python -m kernels_bench <name> ...``: benchmarks. ``--help`` on each for its options.

A product command ``<name>`` is ``kernels_bench.commands.<name>``, a lab command
``kernels_bench.lab.commands.<name>`` (``-`` read as ``_``): its options and ``main``; what it
measures lives in the library packages beside ``commands``. Lab commands are imported only
when run, so the product's commands work without the lab's extra.
"""

from __future__ import annotations

import importlib
import sys

PRODUCT = {
    "status": "where hetserve stands: each claim's number read from the JSON it cites",
    "scheduler": "schedule() cost: ours vs vLLM's, 10..10k waiting",
    "telemetry": "telemetry latency, rate, and step overhead on/off",
    "router": "routing decision latency per policy vs round_robin",
    "profile": "per engine: decode step time vs batch and context, prefill per token",
    "kernels": "a model shape's decode step and prefill (GEMM and attention apart) in plain "
               "torch on this device: the measured floor",
    "predictors": "predictor latency alone and batched, batch 1/16/64",
    "front": "the router's HTTP front under wrk load, beside vllm-router, smg and a Python "
             "pass-through (one core each)",
    "scrape": "the router's CPU per stock vLLM engine scraped (/metrics every 100 ms), "
              "loopback stand-ins serving a real body, vs the 2% target",
}
"""The microbenchmarks a user runs on their own cluster: ``kernels_bench.commands``."""
LAB = {
    "trace": "workflow traces: build, champ, datasheet, validate",
    "artifacts": "train (or keep, when up to date) the predictors the replay routes on",
    "replay": "serving replay: policies compared on a trace",
    "replay-vinelm": "VineLM live with/without re-rooting vs static, on recorded executions",
    "vinelm": "VineLM: collect executions, profile tries, sparse-profiling experiments",
    "twin": "the replay on the digital twin: engine twins with profiled step times, the real "
            "router, a virtual clock",
    "results": "docs/research/results.md from the latest replay",
    "faults": "engines and the router SIGKILLed and SIGSTOPped under load: requests "
              "completed, re-dispatched, failed clearly, lost",
    "soak": "a fault schedule repeated under load for a set duration, every process sampled "
            "(RSS, descriptors, tasks, table sizes)",
    "fuzz-telemetry": "the router's telemetry and KV-event subscribers against garbage frames "
                      "(loopback)",
}
"""The lab's tools and experiments: ``kernels_bench.lab.commands`` (the ``lab`` extra)."""


def module_of(name: str) -> str:
    """The module of command ``name`` (a key of PRODUCT or LAB)."""
    package = "kernels_bench.commands" if name in PRODUCT else "kernels_bench.lab.commands"
    return f"{package}.{name.replace('-', '_')}"


def usage() -> str:
    lines = ["usage: python -m kernels_bench <command> [options]", "", "commands:"]
    lines += [f"  {name:15} {desc}" for name, desc in PRODUCT.items()]
    lines += ["", "lab commands:"]
    lines += [f"  {name:15} {desc}" for name, desc in LAB.items()]
    lines += ["", "The lab (kernels_bench/lab/) needs its extra: pip install -e '.[lab]'."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    if argv[0] not in PRODUCT and argv[0] not in LAB:
        sys.exit(f"unknown command {argv[0]!r}\n\n{usage()}")
    importlib.import_module(module_of(argv[0])).main(argv[1:])


if __name__ == "__main__":
    main()
