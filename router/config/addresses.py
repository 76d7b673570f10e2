"""Addresses in a cluster file: the loopback default, HTTP URLs, loopback TCP ports."""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

LOOPBACK = "127.0.0.1"
"""Every default address of the file."""
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def http_url(host: str, port: int) -> str:
    """URL to reach a server listening on ``host`` (wildcards reached via loopback)."""
    host = LOOPBACK if host in _WILDCARD_HOSTS else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ValueError(f"{url!r}: expected http://HOST:PORT")
    return url


HttpUrl = Annotated[str, AfterValidator(_http_url)]
"""``http(s)://HOST:PORT``, a path allowed."""


def loopback_url_port(url: str) -> int | None:
    """The port of this machine an ``HttpUrl`` names (none: another host's)."""
    parts = urlsplit(url)
    return parts.port if parts.hostname in _LOOPBACK_NAMES else None


def loopback_tcp_port(endpoint: str) -> int | None:
    """The port of this machine a ZeroMQ ``tcp://`` endpoint takes (none: not one)."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if host.strip("[]") not in (*_LOOPBACK_NAMES, "*") or not port.isdigit():
        return None
    return int(port)
