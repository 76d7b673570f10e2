"""``python -m engine_ext.serve``: vLLM's OpenAI server with hetserve's engine patch.

Takes every ordinary vLLM server argument, plus:

  --model SPEC                 a path, a hub id (offline cache) or ``builtin:<name>``
  --engine-id ID               name in telemetry and KV-event topics (default: served name)
  --sched-policy P             stjf (default) | fcfs | priority | mlfq
  --starvation-threshold S     STJF aging threshold S (scheduler_patches.aging)
  --quantum Q                  STJF aging quantum Q
  --mlfq-levels N / --mlfq-base-quantum T
  --retention-ttl-s S / --retention-slack F / --max-protected-programs N /
  --max-protected-fraction F / --retention-ttl-only
                               KV retention between a program's calls
                               (scheduler_patches.protected.RetentionSettings)
  --admit-returning-first      STJF: under KV pressure, admit returning programs whose
                               blocks are retained first
                               (scheduler_patches.program_admission.AdmissionSettings)
  --telemetry-endpoint EP      scheduler snapshots (ipc:// or tcp://127.0.0.1:PORT)
  --telemetry-interval-ms MS   rate limit while busy (default 20)
  --kv-events-endpoint EP      vLLM KV cache events (BlockStored/BlockRemoved/...)

and adds: our scheduler class (async variant when vLLM would schedule asynchronously),
``--enable-prefix-caching``, ``--middleware engine_ext.priority_guard.PriorityGuard``,
``--host 127.0.0.1`` unless a host is given, ``--load-format dummy`` for shape twins,
and HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from engine_ext.curve import engine_curve
from engine_ext.telemetry import DEFAULT_INTERVAL_S, SERVER_PID_ENV
from scheduler_patches.aging import AgingSettings
from scheduler_patches.program_admission import AdmissionSettings
from scheduler_patches.protected import RetentionSettings
from scheduler_patches.settings import ENGINE_POLICIES, from_table, vllm_scheduling_policy


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engine_ext.serve",
        description="vLLM OpenAI server with hetserve's scheduler, telemetry and KV events. "
        "Unknown arguments go to vLLM unchanged.",
    )
    p.add_argument("--model", required=True, help="path, hub id, or builtin:<name>")
    p.add_argument("--engine-id", default=None)
    p.add_argument("--sched-policy", choices=ENGINE_POLICIES, default="stjf")
    p.add_argument("--starvation-threshold", type=int, default=None, metavar="S")
    p.add_argument("--quantum", type=int, default=None, metavar="Q")
    p.add_argument("--max-promotions", type=int, default=None)
    p.add_argument("--mlfq-levels", type=int, default=None)
    p.add_argument("--mlfq-base-quantum", type=int, default=None)
    p.add_argument("--retention-ttl-s", type=float, default=None, metavar="S",
                   help="longest KV protection after a program's call (default 30; 0: off)")
    p.add_argument("--retention-slack", type=float, default=None, metavar="F",
                   help="protect for F x the hint's expected return, within the TTL (2)")
    p.add_argument("--max-protected-programs", type=int, default=None, metavar="N",
                   help="programs protected at once (default 256; 0: off)")
    p.add_argument("--max-protected-fraction", type=float, default=None, metavar="F",
                   help="protected blocks at most this fraction of the KV pool (0.5)")
    p.add_argument("--retention-ttl-only", action="store_const", const=True, default=None,
                   help="baseline (Continuum's rule): ignore the hints' expected return, "
                   "protect every non-final call for the TTL")
    p.add_argument("--admit-returning-first", action="store_const", const=True, default=None,
                   help="stjf: under KV pressure, admit a returning program whose blocks "
                   "are retained before new calls of its starvation level (off)")
    p.add_argument("--telemetry-endpoint", default=None)
    p.add_argument("--telemetry-interval-ms", type=float, default=DEFAULT_INTERVAL_S * 1e3)
    p.add_argument("--kv-events-endpoint", default=None)
    p.add_argument("--telemetry-keys-dir", default=None, metavar="DIR",
                   help="CURVE keys of the telemetry plane (engine_ext.curve): snapshots "
                        "and KV events go encrypted, to a router holding the key only")
    return p


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in args for f in flags)


def _pop_option(args: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` or ``flag=VALUE`` from ``args``; return VALUE."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
            del args[i:i + 2]
            return value
        if a.startswith(flag + "="):
            del args[i]
            return a.split("=", 1)[1]
    return None


def _async_scheduling(passthrough: list[str]) -> bool:
    """Whether vLLM will schedule asynchronously (never on CPU; default on GPU)."""
    if _has_flag(passthrough, "--no-async-scheduling"):
        return False
    from vllm.platforms import current_platform

    return not current_platform.is_cpu()


def vllm_argv(ns: argparse.Namespace, passthrough: list[str]) -> list[str]:
    """The full vLLM server argument list for our options plus the passthrough ones."""
    from engine_ext.builtin_models import load_format, resolve_model
    from engine_ext.instrumented import TelemetrySettings
    from engine_ext.schedulers import scheduler_class
    from scheduler_patches.mlfq import MLFQSettings

    args = list(passthrough)
    served = _pop_option(args, "--served-model-name")
    if served is None and ns.model.startswith("builtin:"):
        served = ns.model.split(":", 1)[1]
    engine_id = ns.engine_id or served or os.path.basename(ns.model.rstrip("/"))

    hetserve: dict[str, Any] = {
        "engine_id": engine_id,
        "policy": ns.sched_policy,
        "telemetry_interval_ms": ns.telemetry_interval_ms,
    }
    if ns.telemetry_endpoint:
        hetserve["telemetry_endpoint"] = ns.telemetry_endpoint
    if ns.telemetry_keys_dir:
        engine_curve(ns.telemetry_keys_dir)  # unreadable keys: an error here, not in the core
        hetserve["telemetry_keys_dir"] = os.path.abspath(ns.telemetry_keys_dir)
    settings = (AgingSettings, MLFQSettings, RetentionSettings, AdmissionSettings)
    for key in (k for cls in settings for k in cls.__pydantic_fields__):
        if getattr(ns, key, None) is not None:
            hetserve[key] = getattr(ns, key)
    for cls in (*settings, TelemetrySettings):  # a bad value: an error here, not in the core
        from_table(cls, hetserve)
    if from_table(AdmissionSettings, hetserve).admit_returning_first and ns.sched_policy != "stjf":
        raise ValueError("--admit-returning-first needs --sched-policy stjf (the order it "
                         f"changes is STJF's), not {ns.sched_policy}")
    extra_raw = _pop_option(args, "--additional-config")
    extra = json.loads(extra_raw) if extra_raw else {}
    extra["hetserve"] = hetserve

    out = ["--model", resolve_model(ns.model)]
    if served:
        out += ["--served-model-name", served]
    if not _has_flag(args, "--load-format") and (fmt := load_format(ns.model)):
        out += ["--load-format", fmt]
    if not _has_flag(args, "--host"):
        out += ["--host", "127.0.0.1"]
    if not _has_flag(args, "--enable-prefix-caching", "--no-enable-prefix-caching"):
        out += ["--enable-prefix-caching"]
    if not _has_flag(args, "--scheduling-policy"):
        out += ["--scheduling-policy", vllm_scheduling_policy(ns.sched_policy)]
    out += ["--scheduler-cls", scheduler_class(ns.sched_policy, _async_scheduling(args))]
    out += ["--additional-config", json.dumps(extra)]
    out += ["--middleware", "engine_ext.priority_guard.PriorityGuard"]
    if ns.kv_events_endpoint:
        out += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": ns.kv_events_endpoint,
            "topic": engine_id,
        })]
    return out + args


def main(argv: list[str] | None = None) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ[SERVER_PID_ENV] = str(os.getpid())  # its EngineCore falls silent without it
    ns, passthrough = build_parser().parse_known_args(argv)
    try:
        argv_out = vllm_argv(ns, passthrough)
    except (ValueError, json.JSONDecodeError) as e:
        sys.exit(f"engine_ext.serve: {e}")
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv = ["engine_ext.serve", *argv_out]
    vllm_main()


if __name__ == "__main__":
    main()
