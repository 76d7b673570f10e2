"""Running ``wrk`` (the load generator, from the OS packages) and reading its report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
_LAT = re.compile(r"^\s+(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$", re.MULTILINE)
_REQS = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")


@dataclass(frozen=True)
class WrkResult:
    """One wrk run: successful responses per second, latency percentiles, errors."""

    requests: int
    seconds: float
    ok_per_s: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int
    timeouts: int

    @property
    def errors(self) -> int:
        return self.non_2xx + self.socket_errors + self.timeouts


def find_wrk() -> str | None:
    return shutil.which("wrk")


def parse(report: str) -> WrkResult:
    """The numbers of a ``wrk --latency`` report (ValueError if it is not one)."""
    reqs = _REQS.search(report)
    lat = {p: float(v) * _UNITS[u] for p, v, u in _LAT.findall(report)}
    if reqs is None or set(lat) != {"50", "99"}:
        raise ValueError(f"not a wrk --latency report:\n{report}")
    requests, seconds = int(reqs.group(1)), float(reqs.group(2)) * _UNITS[reqs.group(3)] / 1e3
    sock = _SOCKET.search(report)
    connect, read, write, timeout = (int(g) for g in sock.groups()) if sock else (0, 0, 0, 0)
    non = _NON2XX.search(report)
    non_2xx = int(non.group(1)) if non else 0
    return WrkResult(requests, seconds, (requests - non_2xx) / seconds, lat["50"], lat["99"],
                     non_2xx, connect + read + write, timeout)


def run(wrk: str, url: str, body: dict[str, object], connections: int, seconds: float,
        core: int | None, timeout_s: float = 10.0) -> WrkResult:
    """POST ``body`` to ``url`` over ``connections`` keep-alive connections (one thread)."""
    with tempfile.TemporaryDirectory(prefix="hs-wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text('wrk.method = "POST"\n'
                          'wrk.headers["Content-Type"] = "application/json"\n'
                          f"wrk.body = [==[{json.dumps(body)}]==]\n")
        cmd = [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", f"--timeout={timeout_s:g}s",
               "--latency", "-s", str(script), url]
        if core is not None:
            cmd = ["taskset", "-c", str(core), *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60,
                             check=False)
    return parse(out.stdout + out.stderr)
