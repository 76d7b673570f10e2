"""``Admission``: one request authenticated, validated, given its program, tokenized when
needed and made the core's ``RoutingRequest``; a RequestError (4xx) otherwise."""

from __future__ import annotations

import time
from typing import Awaitable, Callable, Mapping, NamedTuple

import msgspec

from router.admission import programs
from router.admission.parse import context_error, parse_request, prompt_param
from router.admission.served import ServedModel
from router.auth import Keys, bearer
from router.config.cluster import RouterConfig
from router.metrics import RouterMetrics
from router.request import (AUTO_MODEL, NEW_PROGRAM, PROGRAM_SOURCES, Kind, ParsedRequest,
                            RequestError, Workflow, request_id)
from router.state.cluster import ClusterState
from router.state.conversations import StoredResponse, Turn
from router.tokenize import PromptInfo, Tokenizers
from router.types import RoutingRequest

MAX_PROMPT_TOKENS = 1 << 20
"""Longest prompt taken for a model whose engines set no ``max_model_len`` (with one, the
context bounds it)."""

class Admission:
    """Turns a client's request into the core's, or refuses it with a 4xx."""

    def __init__(self, settings: RouterConfig, keys: Keys, models: Mapping[str, ServedModel],
                 tokenizers: Tokenizers, metrics: RouterMetrics, state: ClusterState,
                 clock: Callable[[], float], wall_clock: Callable[[], float],
                 request_ids: Callable[[], str] = request_id) -> None:
        """``state``: its conversations and stored responses find programs (``clock``
        ages them); ``request_ids``: each admitted request's id."""
        self.settings, self.keys, self.models = settings, keys, models
        self.tokenizers, self.metrics, self.wall_clock = tokenizers, metrics, wall_clock
        self.state, self.clock = state, clock
        self.tokenize_always = True
        """Tokenize every prompt (the policy reads it); else only when it may not fit."""
        self.find_programs = True
        """Find the program of a call that names none the hetserve way (the policy routes
        programs: ``Policy.program_affinity``); else only hetserve's own ids, and the
        engine of a continued response."""
        self.request_ids = request_ids

    async def admit(self, kind: Kind, headers: Mapping[str, str],
                    read: Callable[[], Awaitable[bytes]]
                    ) -> tuple[ParsedRequest, RoutingRequest]:
        """A request authenticated (before ``read`` gives its body), validated, tokenized
        (when the policy reads the prompt, or it may not fit) and made the core's
        request; RequestError (4xx) otherwise."""
        arrival = self.wall_clock()
        trusted = self.keys.check_api(headers)
        parsed = parse_request(kind, await read(), headers,
                               allow_client_priority=self.settings.allow_client_priority,
                               trusted=trusted)
        for name in parsed.ignored:
            self.metrics.untrusted_fields.labels(name).inc()
        self._check_per_model(parsed)
        rid = self.request_ids()
        program = self._program(parsed, headers, rid)
        self.state.stats.programs_found[program.program_source] += 1
        retain = trusted and bool(parsed.tools) and program.program_source in AGENT_SOURCES
        return parsed, _routing_request(parsed, await self._prompt(parsed), arrival, rid,
                                        program, retain)

    def _program(self, parsed: ParsedRequest, headers: Mapping[str, str],
                 rid: str) -> _Program:
        """The request's program (``router.admission.programs``: the first source in its
        order that names one) and, when it continues a stored response, the engine that
        stored it (404 when this router does not know the response)."""
        body, key, workflow = parsed.body, bearer(headers), parsed.workflow
        pid, source, engine, digests = workflow.program_id, "workflow", None, ()
        owner = programs.scope(key, None) if parsed.kind == "responses" else b""
        if self.find_programs and pid is None:
            tenant = programs.scope(key, body.get("user"))
            if (named := programs.named(body, headers)) is not None:
                source, pid = named[0], programs.program_id(named[0], tenant, named[1])
            if self.settings.find_conversations and parsed.kind != "completion":
                digests = programs.conversation_digests(
                    tenant, programs.conversation_items(parsed.kind, body))
        if parsed.previous_response_id is not None:
            stored = self._stored(parsed.previous_response_id, owner)
            engine = stored.engine
            if pid is None and stored.program_id is not None:
                source, pid = "previous_response", stored.program_id
                self.state.join(Turn(pid, stored.model, engine), self.clock())
        if pid is None and digests:
            turn = self.state.conversations.find(digests, self.clock())
            if turn is None:
                source, pid = "new", NEW_PROGRAM + rid
            else:
                source, pid = "conversation", turn.program_id
                self.state.join(turn, self.clock())
        if pid is None:
            source = "none"
        elif pid != workflow.program_id:
            workflow = msgspec.structs.replace(workflow, program_id=pid)
        return _Program(workflow, source, digests, engine, owner)

    def _stored(self, response: str, owner: bytes) -> StoredResponse:
        """A stored response of ``owner``'s; 404 when unknown."""
        stored = self.state.responses.find(response, owner, self.clock())
        if stored is None:
            raise RequestError(404, f"previous_response_id '{response[:100]}' is not known "
                               "to this router: it remembers the engine of each response "
                               "it served for router.program_ttl_s after its last use, "
                               "until it restarts; send the whole conversation instead",
                               param="previous_response_id", code="response_not_found")
        return stored

    def _check_per_model(self, parsed: ParsedRequest) -> None:
        """Every model named in ``per_model`` must be served here (also in a
        ``per_model.priority`` the config drops)."""
        for key, table in parsed.per_model.items():
            unknown = sorted(set(table) - set(self.models))
            if unknown:
                raise RequestError(400, f"'per_model.{key}' names model '{unknown[0]}', "
                                   f"which is not served here; served models: "
                                   f"{', '.join(self.models)}", param=f"per_model.{key}",
                                   code="model_not_found")

    async def _prompt(self, parsed: ParsedRequest) -> PromptInfo | None:
        """Tokenize for the requested model, or for ``auto`` with the shared tokenizer;
        None (not tokenized) when the policy reads no prompt and its bound fits."""
        names = [parsed.model] if parsed.model is not None else list(self.models)
        if parsed.model is not None and parsed.model not in self.models:
            raise RequestError(404, f"model '{parsed.model}' does not exist; served models: "
                               f"{', '.join([*self.models, AUTO_MODEL])}", param="model",
                               code="model_not_found")
        if not self.tokenize_always:
            bound = await self.tokenizers.max_prompt_tokens(names[0], parsed)
            if bound is not None and self._fits(parsed, names, bound):
                return None
        start = time.perf_counter()
        prompt = await self.tokenizers.prompt(names[0], parsed)
        self.metrics.tokenize_latency.observe(time.perf_counter() - start)
        checked = [(length, context_error(parsed, n, length, len(prompt.token_ids)))
                   for n in names if (length := self.models[n].max_model_len) is not None]
        if not checked and len(prompt.token_ids) > MAX_PROMPT_TOKENS:
            raise RequestError(400, f"the prompt is {len(prompt.token_ids)} tokens; without a "
                               f"max_model_len the router takes at most {MAX_PROMPT_TOKENS}",
                               param=prompt_param(parsed.kind),
                               code="context_length_exceeded")
        if len(checked) == len(names) and all(error for _, error in checked):
            error = max(checked, key=lambda c: c[0])[1]  # report the longest context's
            assert error is not None
            raise error
        return prompt

    def _fits(self, parsed: ParsedRequest, names: list[str], tokens: int) -> bool:
        """Whether a prompt of ``tokens`` tokens fits every one of ``names`` (so does any
        shorter one: the exact check in ``_prompt`` would pass them all)."""
        return tokens <= MAX_PROMPT_TOKENS and all(
            context_error(parsed, n, length, tokens) is None
            for n in names if (length := self.models[n].max_model_len) is not None)


AGENT_SOURCES = frozenset(PROGRAM_SOURCES) - {"workflow", "none"}
"""Programs found from what an agent sends (not hetserve's own workflow, which says
itself whether its program returns: ``router.proxy.retention_for``; nor no program)."""


class _Program(NamedTuple):
    """A request's program as admission found it (``Admission._program``)."""

    workflow: Workflow
    """The request's workflow, its ``program_id`` the one found."""
    program_source: str
    conversation: tuple[bytes, ...]
    engine: str | None
    owner: bytes


def _routing_request(parsed: ParsedRequest, prompt: PromptInfo | None, arrival: float,
                     rid: str, program: _Program, retain: bool) -> RoutingRequest:
    """The core's request; without ``prompt`` (not tokenized), an empty prompt of
    0 tokens: every engine it may go to fits it, and its policy reads none of it."""
    workflow, source, conversation, engine, owner = program
    if prompt is None:
        return RoutingRequest(rid, parsed.model, max_tokens=parsed.max_tokens,
                              workflow=workflow, arrival_time=arrival, engine=engine,
                              program_source=source, conversation=conversation, owner=owner,
                              retain=retain)
    return RoutingRequest(
        request_id=rid,
        requested_model=parsed.model,
        prompt_text=prompt.text,
        system_text=prompt.system_text,
        user_text=prompt.user_text,
        prompt_token_ids=prompt.token_ids,
        num_prompt_tokens=len(prompt.token_ids),
        max_tokens=parsed.max_tokens,
        workflow=workflow,
        arrival_time=arrival,
        engine=engine,
        program_source=source,
        conversation=conversation,
        owner=owner,
        retain=retain,
    )
