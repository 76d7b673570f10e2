"""API keys: who may call the router's OpenAI endpoints, and who its admin endpoints.

Keys come from a file (one key per line; blank lines and ``#`` comments skipped) and/or an
environment variable (comma-separated), as ``[router]`` names them (``api_keys_file``,
``api_keys_env``, ``admin_keys_file``, ``admin_keys_env``); never inline in the cluster
file. A client sends ``Authorization: Bearer <key>``, as OpenAI's clients do. Keys are
compared in constant time. Trusted keys (``trusted_keys_file``, ``trusted_keys_env``) are
API keys whose callers may rank their own calls (workflow position, client priority).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from router.request import RequestError

MAX_KEY_CHARS = 512


class KeysError(ValueError):
    """Keys that cannot be loaded (a missing file or variable, an empty set)."""


def load_keys(file: str | None, env: str | None, what: str) -> frozenset[str]:
    """The keys of ``file`` and the variable ``env``; empty if neither is given."""
    keys: list[str] = []
    if file is not None:
        try:
            lines = Path(file).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise KeysError(f"{what}: cannot read {file}: {e.strerror or e}") from None
        keys += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if env is not None:
        value = os.environ.get(env)
        if value is None:
            raise KeysError(f"{what}: environment variable {env} is not set")
        keys += [k.strip() for k in value.split(",") if k.strip()]
    if (file is not None or env is not None) and not keys:
        raise KeysError(f"{what}: no key in {' or '.join(filter(None, (file, env)))}")
    bad = [k for k in keys if len(k) > MAX_KEY_CHARS or not k.isprintable() or " " in k]
    if bad:
        raise KeysError(f"{what}: a key is longer than {MAX_KEY_CHARS} characters or holds "
                        "spaces or control characters")
    return frozenset(keys)


def engine_key(engine: str, var: str) -> str:
    """The API key engine entry ``engine`` requires, from the variable its ``api_key_env``
    names (the launcher gives it to the engine, the router sends it); KeysError if unset."""
    key = os.environ.get(var)
    if not key:
        raise KeysError(f"engines.{engine}.api_key_env: the environment variable {var} is "
                        "not set")
    return key


def bearer(headers: Mapping[str, str]) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, else of Anthropic's
    ``x-api-key`` header, if any."""
    scheme, _, key = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    return headers.get("x-api-key", "").strip() or None


def _known(key: str | None, keys: frozenset[str]) -> bool:
    given = (key or "").encode("utf-8", "replace")
    found = False
    for k in keys:  # every key compared, in constant time each
        found |= hmac.compare_digest(given, k.encode())
    return found


@dataclass(frozen=True)
class Keys:
    api: frozenset[str]
    """Keys of the OpenAI endpoints besides the trusted ones; none of either: no key
    needed, every caller trusted."""
    admin: frozenset[str]
    """Keys of the admin endpoints; empty: loopback callers only, no key."""
    trusted: frozenset[str] = frozenset()
    """Keys of the OpenAI endpoints whose callers may rank their own calls."""

    def check_api(self, headers: Mapping[str, str]) -> bool:
        """Whether the caller is trusted; RequestError 401 (OpenAI's ``invalid_api_key``)
        unless the request may pass at all."""
        if not self.api and not self.trusted:
            return True
        key = bearer(headers)
        if _known(key, self.trusted):
            return True
        if not _known(key, self.api):
            raise RequestError(401, "missing API key: send 'Authorization: Bearer <key>' "
                               "(or 'x-api-key: <key>')"
                               if key is None else "incorrect API key provided",
                               code="invalid_api_key")
        return False

    def admin_allowed(self, headers: Mapping[str, str], local: bool) -> bool:
        """With admin keys, a caller with one; without, a loopback caller."""
        return _known(bearer(headers), self.admin) if self.admin else local
