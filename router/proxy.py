"""``Proxy``: an admitted request forwarded to the engine the core picks, and back.

Per attempt: ask the core for a decision (its failures as RequestError), send the
client's body with the chosen ``model``, ``priority`` and ``max_tokens`` to that engine
through the engine client (``router.engine_client``; live: ``router.upstream``), relay
its answer or SSE stream, and report the request's end to the core exactly once (success,
engine error, client disconnect or abort). An engine that could not be reached or closed
the connection without a byte of an answer is marked down and the request re-dispatched,
at most ``MAX_ROUTE_ATTEMPTS`` times in all.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Callable, Iterable

import msgspec
from aiohttp import web

from router.auth import engine_key
from router.config.cluster import RouterConfig
from router.config.engines import EngineInstance, PriorityWire
from router.dispatch.core import RouterCore
from router.engine_client import EngineCall, EngineClient, EngineReply, StreamResult
from router.metrics import RouterMetrics
from router.request import (PATHS, Kind, ParsedRequest, RequestError, Workflow, overloaded,
                            request_id)
from router.state.conversations import StoredResponse, Turn
from router.types import Decision, NoEngineAvailable, Overloaded, RoutingRequest
from router.upstream import (StreamTimeouts, Upstream, UpstreamError, completion_tokens,
                             response_id)
from scheduler_patches.contract import (PRIORITY_HEADER, PRIORITY_MAX, RETAIN_PREFIX,
                                        XARGS_FIELD, RetentionHint)

AGENTIC_CONTEXT = "agentic_context"
"""vllm-router's program context in ``vllm_xargs`` (an object, which vLLM's own
``vllm_xargs`` refuses): read by admission, never forwarded."""

MAX_ROUTE_ATTEMPTS = 3
"""Routing attempts per request when the chosen engine cannot be reached or fails before
answering (``redispatch``)."""

log = logging.getLogger(__name__)
_encode = msgspec.json.encode


class _Completion:
    """Reports one routed request's end to the core, exactly once."""

    def __init__(self, core: RouterCore, decision: Decision) -> None:
        self._core, self.decision, self._done = core, decision, False

    def finish(self, output_tokens: int, error: str | None) -> None:
        if not self._done:
            self._done = True
            self._core.routing.on_complete(self.decision, output_tokens, error)


class Proxy:
    """Forwards admitted requests: decision, engine call, relay, retry elsewhere."""

    def __init__(self, settings: RouterConfig, core: RouterCore, metrics: RouterMetrics,
                 client: EngineClient | None = None,
                 request_ids: Callable[[], str] = request_id) -> None:
        """``client``: the engine client; None: ``router.upstream.Upstream``, opened by
        ``start``. ``request_ids``: the ids of calls that pass through (admission gives
        the routed ones theirs)."""
        self.settings, self.core, self.metrics = settings, core, metrics
        self.request_ids = request_ids
        self.engine_auth = engine_auth(core.membership.instances.values())
        """The ``Authorization`` value of each engine that requires an API key."""
        self.client = client

    def start(self) -> None:
        """Open the connection pool to the engines (in the serving loop), unless a client
        was given."""
        if self.client is None:
            r = self.settings
            self.client = Upstream(r.request_timeout_s, r.max_inflight,
                                   StreamTimeouts(r.stream_first_byte_timeout_s,
                                                  r.stream_stall_timeout_s))

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def forget(self, instance: str) -> None:
        """A removed engine's key is dropped."""
        self.engine_auth.pop(instance, None)

    async def serve(self, request: web.BaseRequest | None, parsed: ParsedRequest,
                    routing: RoutingRequest) -> web.StreamResponse:
        """The engine's answer, re-dispatched while ``redispatch`` says so; RequestError
        when routing or the last attempt fails. ``request``: the HTTP request a streamed
        answer is written to (None: a caller without one, whose requests do not stream)."""
        attempt = 1
        while True:
            completion = _Completion(self.core, await self.route(routing))
            dec = completion.decision
            if routing.conversation and dec.program_id is not None:
                self.core.state.conversations.remember(
                    routing.conversation[-1], Turn(dec.program_id, dec.model, dec.instance),
                    self.core.routing.clock())
            try:
                return await self._forward(request, parsed, routing, completion)
            except UpstreamError as exc:
                if not redispatch(exc) or attempt == MAX_ROUTE_ATTEMPTS:
                    raise exc.error() from None
            self.metrics.redispatched.inc()
            attempt += 1

    async def route(self, routing: RoutingRequest) -> Decision:
        """The core's decision; its failures as RequestError (503, 429, 400, 500)."""
        try:
            return await self.core.routing.route(routing)
        except NoEngineAvailable as exc:
            raise RequestError(503, f"no engine available: {exc}", type_="service_unavailable",
                               code="no_engine_available") from None
        except Overloaded as exc:
            raise overloaded(str(exc)) from None
        except ValueError as exc:
            raise RequestError(400, str(exc), code="invalid_value") from None
        except Exception as exc:  # a policy or predictor bug: this request fails alone
            log.exception("routing request %s failed", routing.request_id)
            raise RequestError(500, f"the router could not route this request "
                               f"({type(exc).__name__})", type_="server_error",
                               code="routing_failed") from None

    def _upstream_failed(self, completion: _Completion, exc: UpstreamError,
                         output_tokens: int = 0) -> None:
        instance = completion.decision.instance
        self.metrics.upstream_errors.labels(instance, exc.kind).inc()
        completion.finish(output_tokens, str(exc))
        if exc.kind in ("connect", "protocol", "timeout"):
            log.warning("marking engine %s down: %s", instance, exc)
            self.core.membership.mark_engine(instance, False, str(exc), probe=True)

    async def _forward(self, request: web.BaseRequest | None, parsed: ParsedRequest,
                       routing: RoutingRequest, completion: _Completion
                       ) -> web.StreamResponse:
        decision, request_id = completion.decision, routing.request_id
        inst = self.core.membership.instances.get(decision.instance)
        priority, max_tokens = engine_settings(
            parsed, decision, "hetserve" if inst is None else inst.priority_wire)
        body = upstream_body(parsed, decision.model, priority, max_tokens,
                             self._retention(routing))
        path = PATHS[parsed.kind]
        headers = {"content-type": "application/json", "x-request-id": request_id}
        if parsed.kind == "messages" and priority is not None:  # vLLM's Messages: no field
            headers[PRIORITY_HEADER] = str(priority)
        auth = self._auth(decision.instance)
        if auth is not None:
            headers["authorization"] = auth
        response_headers = {"x-request-id": request_id, **_decision_headers(decision, priority)}
        if decision.program_id is not None:
            response_headers["x-hetserve-program"] = _shown(decision.program_id)
            response_headers["x-hetserve-program-source"] = routing.program_source
        call = EngineCall(parsed, routing, decision, priority, max_tokens, path, body, headers)
        assert self.client is not None
        try:
            reply = await self.client.send(call)
            if parsed.stream and reply.status == 200:
                assert request is not None, "a streamed answer needs the HTTP request"
                return await self._relay(request, completion, reply, parsed, routing.owner,
                                         response_headers)
            content = await reply.read()
        except UpstreamError as exc:
            self._upstream_failed(completion, exc)
            raise
        except asyncio.CancelledError:  # the client left (or the router stops)
            completion.finish(0, "client disconnected")
            raise
        except BaseException:
            completion.finish(0, "aborted")
            raise
        error = None if reply.status < 400 else f"engine answered {reply.status}"
        if error is None and parsed.kind == "responses":
            self._stored(response_id(content), decision, routing.owner)
        completion.finish(completion_tokens(content) if error is None else 0, error)
        response_headers["content-type"] = reply.content_type
        return web.Response(body=content, status=reply.status, headers=response_headers)

    async def pass_through(self, kind: Kind, instance: str, method: str, path: str,
                           body: bytes) -> web.Response:
        """A call that generates nothing (a stored response's retrieval, cancel or
        deletion; Messages' token count) sent to ``instance`` as it came, its answer
        returned whole; RequestError when the engine is down or fails."""
        engine = self.core.state.table.engines.get(instance)
        if engine is None or engine.down_reason is not None:
            raise RequestError(503, f"engine '{instance}' is "
                               f"{'removed' if engine is None else 'down'}; retry later",
                               type_="service_unavailable", code="no_engine_available",
                               retry_after_s=1)
        rid = self.request_ids()
        decision = Decision(rid, instance, engine.model, engine.url, "pass_through")
        parsed = ParsedRequest(kind, {}, engine.model, False, False, None, "max_tokens")
        headers = {"content-type": "application/json", "x-request-id": rid}
        if (auth := self._auth(instance)) is not None:
            headers["authorization"] = auth
        assert self.client is not None
        call = EngineCall(parsed, RoutingRequest(rid, engine.model), decision, None, None,
                          path, body, headers, method)
        try:
            reply = await self.client.send(call)
            content = await reply.read()
        except UpstreamError as exc:
            raise exc.error() from None
        return web.Response(body=content, status=reply.status, headers={
            "x-request-id": rid, "x-hetserve-engine": instance,
            "content-type": reply.content_type})

    def _retention(self, routing: RoutingRequest) -> RetentionHint | None:
        """The retention hint of a call: its workflow's (``retention_for``), else, for an
        agent's call (``RoutingRequest.retain``), a hint that its program returns, after
        the gap its last return took (``ProgramTable.return_s``; unknown: the engine's
        ``retention_ttl_s``, Continuum's rule)."""
        hint = retention_for(routing.workflow)
        pid = routing.workflow.program_id
        if hint is None and routing.retain and pid is not None:
            hint = RetentionHint(pid, False, self.core.state.programs.return_s(pid))
        return hint

    def _stored(self, response: str | None, decision: Decision, owner: bytes) -> None:
        """A Responses-API response the decision's engine stored for ``owner``."""
        if response is not None:
            self.core.state.responses.stored(
                response, StoredResponse(decision.instance, decision.model,
                                         decision.program_id, owner),
                self.core.routing.clock())

    async def _relay(self, request: web.BaseRequest, completion: _Completion,
                     reply: EngineReply, parsed: ParsedRequest, owner: bytes,
                     headers: dict[str, str]) -> web.StreamResponse:
        """Relay an engine's SSE stream; report its end exactly once. A failure after
        the first byte ends the stream with the API's error event (chat: no
        ``[DONE]``)."""
        result = StreamResult()
        out = web.StreamResponse(status=200, headers={**headers,
                                                      "content-type": "text/event-stream"})
        error: str | None = "aborted"
        try:
            await out.prepare(request)
            async for event in reply.events(result, parsed.include_usage
                                            or parsed.kind in ("responses", "messages")):
                await out.write(event)
            await out.write_eof()
            error = None
        except UpstreamError as exc:
            self._upstream_failed(completion, exc, result.output_tokens)
            try:
                await out.write(stream_error(parsed, exc.error()))
                await out.write_eof()
            except (ConnectionError, RuntimeError):
                pass
        except (ConnectionError, asyncio.CancelledError) as exc:
            error = "client disconnected"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._stored(result.response_id, completion.decision, owner)
            completion.finish(result.output_tokens, error)
            reply.cancel()
        return out

    def _auth(self, instance: str) -> str | None:
        """The ``Authorization`` value for ``instance`` (an added engine's on first use)."""
        auth = self.engine_auth.get(instance)
        inst = self.core.membership.instances.get(instance)
        if auth is None and inst is not None and inst.api_key_env:
            auth = self.engine_auth[instance] = engine_auth([inst])[instance]
        return auth


def stream_error(parsed: ParsedRequest, error: RequestError) -> bytes:
    """The event that ends a stream cut by a failure, in the API's shape: Anthropic's
    ``error`` event, the Responses API's ``error`` event, else an OpenAI error object."""
    if parsed.kind == "messages":
        return b"event: error\ndata: " + _encode(error.body("messages")) + b"\n\n"
    if parsed.kind == "responses":
        return b"event: error\ndata: " + _encode(
            {"type": "error", "code": error.code, "message": error.message,
             "param": error.param}) + b"\n\n"
    return b"data: " + _encode(error.body()) + b"\n\n"


def engine_settings(parsed: ParsedRequest, decision: Decision,
                    wire: PriorityWire = "hetserve") -> tuple[int | None, int | None]:
    """(priority, max_tokens) sent to the engine: the client's priority (when allowed),
    else its ``per_model.priority`` for the chosen model, else the policy's, as the
    engine's ``wire`` takes it (``router.config.engines.priority_wire``); the client's
    ``per_model.max_tokens`` for the chosen model within the policy's clamp."""
    priority = parsed.client_priority
    if priority is None:
        priority = parsed.model_priority.get(decision.model, decision.priority)
    if wire == "none":
        priority = None
    elif wire == "stock" and not priority:
        priority = PRIORITY_MAX
    max_tokens = decision.max_tokens
    forced = parsed.model_max_tokens.get(decision.model)
    if forced is not None:
        max_tokens = forced if max_tokens is None else min(forced, max_tokens)
    return priority, max_tokens


def upstream_body(parsed: ParsedRequest, model: str, priority: int | None,
                  max_tokens: int | None, hint: RetentionHint | None = None) -> bytes:
    """The body sent to the engine: the client's body with ``model``, ``priority`` and
    ``max_tokens`` set by the router, ``workflow``, ``priority`` and ``per_model`` removed,
    usage requested on streams (the router strips the usage chunk again if the client
    did not ask for it), and the retention ``hint`` (``Proxy._retention``) in
    ``vllm_xargs``, whose ``hetserve_*`` keys only the router sets."""
    body = {k: v for k, v in parsed.body.items()
            if k not in ("workflow", "priority", "per_model")}
    body["model"] = model
    if priority is not None and parsed.kind != "messages":  # Messages: a header
        body["priority"] = priority
    if max_tokens is not None:
        body[parsed.max_tokens_param] = max_tokens
    if parsed.stream and parsed.kind in ("chat", "completion"):
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    xargs = body.get(XARGS_FIELD)
    if isinstance(xargs, dict) or (xargs is None and hint is not None):  # else: engine's 400
        body[XARGS_FIELD] = {**{k: v for k, v in (xargs or {}).items()
                                if not k.startswith(RETAIN_PREFIX) and k != AGENTIC_CONTEXT},
                             **(hint.xargs() if hint is not None else {})}
    return _encode(body)


def retention_for(workflow: Workflow) -> RetentionHint | None:
    """The engine's retention hint for a call of a program whose position is known (from
    a trusted caller: ``final``, or ``stage_index`` and ``num_stages``), None otherwise."""
    known = workflow.final is not None or (workflow.stage_index is not None
                                           and workflow.num_stages is not None)
    if workflow.program_id is None or not known:
        return None
    return RetentionHint(workflow.program_id, workflow.is_final, workflow.expected_return_s)


def engine_auth(instances: Iterable[EngineInstance]) -> dict[str, str]:
    """The ``Authorization`` value of each engine that requires an API key
    (``api_key_env``; KeysError, a ValueError, when its variable is not set)."""
    return {inst.name: f"Bearer {engine_key(inst.engine, inst.api_key_env)}"
            for inst in instances if inst.api_key_env}


def redispatch(exc: UpstreamError) -> bool:
    """Whether a failed call goes to another engine (re-routed: another engine of the
    model, or another model for ``auto``): the engine was unreachable, or closed the
    connection without a byte of an answer (it died or restarted while the request
    waited or ran). Not after a timeout (the client has waited that long already) nor a
    5xx (the engine judged the request; another would likely judge the same)."""
    return exc.unanswered and exc.kind in ("connect", "protocol")


def _decision_headers(decision: Decision, priority: int | None) -> dict[str, str]:
    """The ``x-hetserve-*`` response headers (``none`` for no prediction or priority)."""
    predicted = decision.predicted_remaining_tokens
    return {"x-hetserve-model": decision.model, "x-hetserve-engine": decision.instance,
            "x-hetserve-policy": decision.policy,
            "x-hetserve-predicted-remaining-tokens":
                str(round(predicted)) if predicted is not None and math.isfinite(predicted)
                else "none",
            "x-hetserve-priority": "none" if priority is None else str(priority)}


def _shown(program_id: str) -> str:
    """A program id as a header value (a client's own, when it is one: printable ASCII)."""
    return program_id if program_id.isascii() and program_id.isprintable() else "unprintable"
