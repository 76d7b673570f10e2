"""A call's program, from what its client already sends.

Agents and frameworks name their sessions in their own ways; the first of these a call
carries names its program (docs/router.md, "Programs"):

1. ``workflow``: hetserve's own ``workflow.program_id`` (body) or ``X-Hetserve-Program-Id``;
2. ``agentic_context``: vllm-router's ``vllm_xargs.agentic_context`` object, its
   ``program_id``, else its ``session_id`` (with ``agent_id``, a subagent's own program);
3. ``session``: a session header (Claude Code's ``X-Claude-Code-Session-Id``, with
   ``X-Claude-Code-Agent-Id`` for a subagent; Codex's ``session_id``; the generic and
   vLLM's ``X-Session-Id``), or vLLM's ``session_id`` (body, or ``vllm_xargs``);
4. ``prompt_cache_key``: OpenAI's (chat completions and Responses);
5. ``metadata_user_id``: Anthropic's ``metadata.user_id`` (Claude Code puts its session
   in it);
6. ``previous_response``: the Responses call it continues (``previous_response_id``): the
   program of that call;
7. ``conversation``: the call's conversation extends one an earlier call sent whole
   (``router.state.conversations``);
8. ``new``: none of those: a new program, which the call's successors join by 6 or 7.

Ids from 2-5 are hashed with the caller's API key and OpenAI's ``user``, so equal ids of
different keys or users never meet, and no client's id reaches an engine or a log; so is
every conversation. The workflow's ranking fields stay trusted-only
(``router.admission.workflow.RANKING_FIELDS``); a program id ranks nothing, as before.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Mapping

import msgspec

from router.request import Kind, ProgramSource

SESSION_HEADERS = ("x-claude-code-session-id", "session_id", "x-session-id")
"""Session headers, first found wins (Claude Code's, Codex's, the generic one vLLM reads)."""
AGENT_HEADER = "x-claude-code-agent-id"
MAX_ID_CHARS = 1024
"""Longest client id read (longer ones are no id)."""

_encode = msgspec.json.encode


def _id(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS else None


def _with_agent(session: str | None, agent: Any) -> str | None:
    agent = _id(agent)
    return None if session is None else f"{session}/{agent}" if agent else session


def scope(api_key: str | None, user: Any) -> bytes:
    """What separates tenants: the caller's key and OpenAI's ``user``."""
    return _scope(api_key, _id(user))


@functools.lru_cache(maxsize=4096)
def _scope(api_key: str | None, user: str | None) -> bytes:
    """``scope``'s digest (the last 4,096 pairs' kept: a tenant's calls hash once)."""
    return hashlib.blake2b(f"{api_key or ''}\0{user or ''}".encode(),
                           digest_size=16).digest()


def named(body: Mapping[str, Any],
          headers: Mapping[str, str]) -> tuple[ProgramSource, str] | None:
    """The first client convention (2-5 above) the call carries: (source, id)."""
    xargs = body.get("vllm_xargs")
    xargs = xargs if isinstance(xargs, dict) else {}
    context = xargs.get("agentic_context")
    if isinstance(context, dict):
        found = _id(context.get("program_id")) or _with_agent(_id(context.get("session_id")),
                                                              context.get("agent_id"))
        if found:
            return "agentic_context", found
    for name in SESSION_HEADERS:  # the headers' names are case-insensitive (aiohttp's)
        if (value := headers.get(name)) is not None and (found := _id(value)) is not None:
            agent = headers.get(AGENT_HEADER) if name == SESSION_HEADERS[0] else None
            return "session", _with_agent(found, agent) or found
    for source, value in (("session", body.get("session_id")),
                          ("session", xargs.get("session_id")),
                          ("prompt_cache_key", body.get("prompt_cache_key"))):
        if value is not None and (found := _id(value)) is not None:
            return source, found
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and (found := _id(metadata.get("user_id"))) is not None:
        return "metadata_user_id", found
    return None


def program_id(source: ProgramSource, tenant: bytes, value: str) -> str:
    """The program id of a client's ``value`` found by ``source``, within ``tenant``."""
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=12,
                             key=tenant).hexdigest()
    return f"{source}:{digest}"


def conversation_items(kind: Kind, body: Mapping[str, Any]) -> list[Any]:
    """The items whose order makes the call's conversation: chat's messages; Messages'
    system and messages; Responses' instructions and input (completions have none)."""
    if kind == "chat":
        return list(body.get("messages") or ())
    if kind == "messages":
        return [body.get("system"), *(body.get("messages") or ())]
    if kind == "responses":
        given = body.get("input")
        return [body.get("instructions"), *(given if isinstance(given, list) else [given])]
    return []


def conversation_digests(tenant: bytes, items: list[Any]) -> tuple[bytes, ...]:
    """Digest of each prefix of ``items``: the k-th covers the first k + 1 (one hash pass
    over the items' JSON)."""
    h = hashlib.blake2b(digest_size=16, key=tenant)
    out = []
    for item in items:
        h.update(_encode(item))
        h.update(b"\x1e")
        out.append(h.digest())
    return tuple(out)
