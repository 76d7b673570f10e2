"""CurveZMQ on the telemetry plane: the engines' scheduler snapshots and KV events reach
the router encrypted, and each side proves who it is (ZeroMQ's CURVE, pyzmq's zmq.auth).

One key directory per cluster, made by ``python -m engine_ext.curve DIR``:

- ``router.key_secret`` / ``router.key``: the router's keypair. The router is the CURVE
  server of every telemetry connection, whichever side binds; an engine connects only to
  a router that holds this secret (``curve_serverkey`` pins it).
- ``engines.key_secret`` / ``engines.key``: the keypair every engine presents. The router
  accepts no other client key (a ZAP handler), so a host that can reach a telemetry port
  but lacks the key can neither read nor inject frames.

A host needs only its side's files: an engine host ``engines.key_secret`` and
``router.key``, the router host ``router.key_secret`` and ``engines.key``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

ROUTER = "router"
ENGINES = "engines"


class CurveKeyError(ValueError):
    """A key file that is missing or unreadable, or a directory that cannot be made."""


def _load(directory: str | Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    path = Path(directory) / (f"{name}.key_secret" if secret else f"{name}.key")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise CurveKeyError(f"telemetry key {path}: {getattr(e, 'strerror', None) or e}"
                            " (make the directory with: python -m engine_ext.curve DIR)"
                            ) from None
    if secret and secret_key is None:
        raise CurveKeyError(f"telemetry key {path}: holds no secret key")
    return public, secret_key


@dataclass(frozen=True)
class EngineCurve:
    """An engine's side: its keypair and the router's public key."""

    public: bytes
    secret: bytes
    server: bytes

    def apply(self, sock: zmq.Socket) -> None:  # type: ignore[type-arg]
        """Make ``sock`` a CURVE client of the router (before bind or connect)."""
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server


@dataclass(frozen=True)
class RouterCurve:
    """The router's side: its keypair and the one client key it accepts."""

    public: bytes
    secret: bytes
    engines: bytes

    def apply(self, sock: zmq.Socket) -> None:  # type: ignore[type-arg]
        """Make ``sock`` a CURVE server (before bind or connect)."""
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def callback(self, _domain: str, key: bytes) -> bool:
        """ZAP: only the engines' key may connect (``configure_curve_callback``)."""
        return key == self.engines


def engine_curve(directory: str | Path) -> EngineCurve:
    public, secret = _load(directory, ENGINES, secret=True)
    assert secret is not None
    return EngineCurve(public, secret, _load(directory, ROUTER, secret=False)[0])


def router_curve(directory: str | Path) -> RouterCurve:
    public, secret = _load(directory, ROUTER, secret=True)
    assert secret is not None
    return RouterCurve(public, secret, _load(directory, ENGINES, secret=False)[0])


def create(directory: str | Path) -> list[Path]:
    """Make both keypairs in ``directory`` (mode 0700); refuses to replace a key."""
    d = Path(directory)
    names = [d / f"{n}.{ext}" for n in (ROUTER, ENGINES) for ext in ("key", "key_secret")]
    existing = [str(p) for p in names if p.exists()]
    if existing:
        raise CurveKeyError(f"{existing[0]} exists: keys are never replaced; remove them "
                            "first to make new ones (every host then needs the new ones)")
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in (ROUTER, ENGINES):
            zmq.auth.create_certificates(d, name)
    except OSError as e:
        raise CurveKeyError(f"{d}: {e.strerror or e}") from None
    for p in names:
        p.chmod(0o600 if p.suffix == ".key_secret" else 0o644)
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine_ext.curve",
        description="Make the CURVE keys of a cluster's telemetry plane "
                    "([router] telemetry_keys_dir; docs/reliability.md).")
    parser.add_argument("directory", help="created if missing; existing keys are kept")
    ns = parser.parse_args(argv)
    try:
        made = create(ns.directory)
    except CurveKeyError as e:
        sys.exit(f"error: {e}")
    for p in made:
        print(p)


if __name__ == "__main__":
    main()
