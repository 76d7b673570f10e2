"""``python -m launcher CLUSTER.toml [--dry-run] [--demo] [--only NAME] [--run-dir DIR]``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from launcher import LaunchError
from launcher.console import Console
from launcher.devices import detect_devices
from launcher.plan import make_plan
from launcher.run import launch
from router.config import ConfigError, load_cluster_config


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
    p.add_argument("--run-dir", type=Path,
                   help="logs, sockets and the resolved cluster file (default: "
                   "launcher.run_dir, else runs/<timestamp> in the current directory)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.demo and args.only:
        build_parser().error("--demo needs the router, which --only does not start")
    try:
        cfg = load_cluster_config(args.config)
        run_dir = _run_dir(args.run_dir or cfg.launcher.run_dir)
        plan = make_plan(cfg, detect_devices(), run_dir, only=args.only)
        if args.dry_run:
            Console().raw(plan.render())
            return 0
        return launch(plan, Console(), demo=args.demo)
    except (ConfigError, LaunchError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


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
