"""``python -m kernels_bench <name> ...``: benchmarks. ``--help`` on each for its options."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "scheduler": ("kernels_bench.scheduler_bench", "schedule() cost: ours vs vLLM's, 10..10k waiting"),
    "telemetry": ("kernels_bench.telemetry_bench", "telemetry latency, rate, and step overhead on/off"),
    "router": ("kernels_bench.router_bench", "routing decision latency per policy vs round_robin"),
    "trace": ("kernels_bench.trace.cli", "workflow traces: build, champ, datasheet, validate"),
    "profile": ("kernels_bench.profile_bench", "per engine: decode step time vs batch and "
                "context, prefill per token"),
    "kernels": ("kernels_bench.floor.cli", "a model shape's decode step and prefill (GEMM "
                "and attention apart) in plain torch on this device: the measured floor"),
    "artifacts": ("kernels_bench.artifacts", "train (or keep, when up to date) the "
                  "predictors the replay routes on"),
    "replay": ("kernels_bench.replay.cli", "serving replay: policies compared on a trace"),
    "replay-vinelm": ("kernels_bench.replay.vinelm", "VineLM live with/without re-rooting vs "
                      "static, on recorded executions"),
    "vinelm": ("kernels_bench.vinelm.cli", "VineLM: collect executions, profile tries, "
               "sparse-profiling experiments"),
    "twin": ("kernels_bench.twin.cli", "the replay on the digital twin: engine twins with "
             "profiled step times, the real router, a virtual clock"),
    "results": ("kernels_bench.replay.results", "docs/results.md from the latest replay"),
    "predictors": ("kernels_bench.predictor_bench", "predictor latency alone and batched, batch 1/16/64"),
    "front": ("kernels_bench.front.cli", "the router's HTTP front under wrk load, beside "
              "vllm-router, smg and a Python pass-through (one core each)"),
    "faults": ("kernels_bench.faults", "engines and the router SIGKILLed and SIGSTOPped under "
               "load: requests completed, re-dispatched, failed clearly, lost"),
    "fuzz-telemetry": ("kernels_bench.telemetry_fuzz", "the router's telemetry and KV-event "
                       "subscribers against garbage frames (loopback)"),
}


def usage() -> str:
    lines = ["usage: python -m kernels_bench <command> [options]", "", "commands:"]
    lines += [f"  {name:15} {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    if argv[0] not in COMMANDS:
        sys.exit(f"unknown command {argv[0]!r}\n\n{usage()}")
    module = importlib.import_module(COMMANDS[argv[0]][0])
    module.main(argv[1:])


if __name__ == "__main__":
    main()
