"""``python -m router.predictors.telemetry_log ENDPOINT... --out FILE``: record engines'
scheduler snapshots as JSON lines, the training data of the latency heads.

Subscribes like the router does (connecting to endpoints the engines bind, binding the
others) and writes every decodable snapshot (heartbeats included; ``tpot.samples`` skips
what it cannot use) until ``--seconds`` pass or Ctrl-C. Malformed frames are counted and
dropped.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path
from typing import IO

import msgspec
import zmq
from tqdm import tqdm

from engine_ext.telemetry import snapshot_decoder, subscriber_binds


def _open(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "ab")  # type: ignore[return-value]
    return open(path, "ab")


def record(endpoints: list[str], out: Path, seconds: float) -> int:
    """Append snapshots from ``endpoints`` to ``out`` for ``seconds``; return the count."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    for ep in endpoints:
        (sock.bind if subscriber_binds(ep) else sock.connect)(ep)
    decoder = snapshot_decoder()
    deadline = time.monotonic() + seconds
    n = 0
    with _open(out) as f, tqdm(desc="snapshots", unit="frame") as bar:
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(min(1000, int(left * 1000) + 1)):
                    continue
                got = decoder.decode(sock.recv_multipart())
                if got is not None:
                    f.write(msgspec.json.encode(got[2]) + b"\n")
                    n += 1
                    bar.update()
        except KeyboardInterrupt:
            pass
        bar.set_postfix(malformed=decoder.malformed)
    sock.close(linger=0)
    return n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m router.predictors.telemetry_log",
                                description=__doc__.split("\n")[0])
    p.add_argument("endpoints", nargs="+", help="engines' telemetry endpoints")
    p.add_argument("--out", type=Path, required=True, help="JSON lines (.gz: gzip), appended")
    p.add_argument("--seconds", type=float, default=3600.0)
    args = p.parse_args(argv)
    n = record(args.endpoints, args.out, args.seconds)
    print(f"{n} snapshots appended to {args.out}")


if __name__ == "__main__":
    main()
