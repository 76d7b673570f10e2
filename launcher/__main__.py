"""``python -m launcher CLUSTER.toml [--dry-run] [--demo] [--only NAME] [--run-dir DIR]
[--scale NAME=N]``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from launcher import LaunchError
from launcher.backends import backend_class
from launcher.console import Console
from launcher.devices import detect_devices
from launcher.planner import make_plan
from launcher.run import launch
from launcher.scale import ask_to_scale
from launcher.settings import LaunchConfig, load_launch_config
from router.config.cluster import ConfigError
from router.config.engines import MAX_REPLICAS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher",
        description="Start a hetserve cluster (engines, then the router) from a cluster "
        "file, supervise it, and stop all of it on Ctrl-C or SIGTERM. See docs/cluster.md.")
    p.add_argument("config", type=Path, help="cluster file (TOML)")
    p.add_argument("--dry-run", action="store_true",
                   help="print every process's command, environment and ports, then exit")
    p.add_argument("--demo", action="store_true",
                   help="once the cluster is up, run examples/demo_client.py against the "
                   "router, then shut down (exit code: the client's)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="start only this engine entry (repeatable) and no router: for a "
                   "host that serves engines to a router elsewhere")
    p.add_argument("--scale", action="append", default=[], metavar="NAME=N",
                   type=_scale_arg,
                   help="ask the launcher running this cluster (on Ray, in --run-dir) to "
                   "run N replicas of engine NAME: new ones join routing when healthy, "
                   "removed ones are drained first (repeatable)")
    p.add_argument("--run-dir", type=Path,
                   help="logs, sockets and the resolved cluster file (default: "
                   "launcher.run_dir, else runs/<timestamp> in the current directory)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.demo and args.only:
        build_parser().error("--demo needs the router, which --only does not start")
    if args.scale and (args.demo or args.only or args.dry_run):
        build_parser().error("--scale talks to a running launcher: give it alone")
    try:
        cfg = load_launch_config(args.config)
        if args.scale:
            return _scale(cfg, args.run_dir, args.scale)
        run_dir = _run_dir(args.run_dir or cfg.launcher.run_dir)
        return _run(cfg, run_dir, args.only, args.dry_run, args.demo)
    except (ConfigError, LaunchError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _scale_arg(text: str) -> tuple[str, int]:
    name, _, n = text.partition("=")
    if not name or not n.isdigit() or not 1 <= int(n) <= MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=N, N from 1 to "
                                         f"{MAX_REPLICAS}")
    return name, int(n)


def _scale(cfg: LaunchConfig, run_dir: Path | None, wanted: list[tuple[str, int]]) -> int:
    """``--scale``: ask the running launcher; 0 if it took every change."""
    if not backend_class(cfg.cluster.backend).scales:
        raise LaunchError('--scale needs [cluster] backend = "ray" (engines placed on a Ray '
                          "cluster); on one machine, edit replicas and restart")
    given = run_dir or cfg.launcher.run_dir
    if given is None:
        raise LaunchError("--scale: give --run-dir of the running cluster (or set "
                          "launcher.run_dir in the file)")
    ok = True
    for name, n in wanted:
        reply = ask_to_scale(Path(given).absolute(), name, n)
        print(("" if reply.ok else "refused: ") + reply.message)
        ok = ok and reply.ok
    return 0 if ok else 1


def _run(cfg: LaunchConfig, run_dir: Path, only: list[str], dry_run: bool,
         demo: bool) -> int:
    """Plan the cluster, its engines on the backend ``[cluster]`` names, and run it (or
    print the plan)."""
    cls = backend_class(cfg.cluster.backend)
    cls.check_only(only)
    backend = cls.connect(cfg.cluster, run_dir)
    try:
        plan = make_plan(cfg, detect_devices(), run_dir, only=only,
                         ray_host=backend.telemetry_host)
        if dry_run:
            text = plan.render()
            fit = backend.fit([(p.spec.name, p.spec.placement) for p in plan.engines])
            if fit:
                text += ("\n\nplacement on the cluster's free resources now:\n"
                         + "\n".join(f"  {ln}" for ln in fit))
            Console().raw(text)
            return 0
        return launch(plan, backend, Console(), demo=demo)
    finally:
        backend.close()


def _run_dir(given: str | Path | None) -> Path:
    if given is not None:
        return Path(given).absolute()
    base = Path.cwd() / "runs" / time.strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


if __name__ == "__main__":
    sys.exit(main())
