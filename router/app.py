"""The router's HTTP front: an OpenAI-compatible aiohttp app over ``RouterCore``.

``create_app(config)`` serves ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``, ``/metrics`` and, to loopback or unix-socket clients only (or
with an admin key), ``POST /admin/engines/{instance}/down|up|move``. Per request: parse and
validate (``router.request``), tokenize with the model's tokenizer (``router.tokenize``;
for a policy that reads no prompt, only when a bound on the token count does not show
that the prompt fits every candidate's context), ask the core for a decision, forward to the chosen engine (``router.upstream``) with the
chosen ``model``, ``priority`` and ``max_tokens``, and report the completion to the core
exactly once (success, engine error, client disconnect or abort).

Serve it with ``RUNNER_OPTIONS`` (``router.__main__``): a client that disconnects
cancels its handler, which is how an abandoned request is noticed and reported.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping

import aiohttp
import msgspec
from aiohttp import web

from router.auth import Keys, engine_key, load_keys
from router.config.addresses import is_loopback
from router.config.cluster import ClusterConfig, ConfigError
from router.config.engines import EngineInstance
from router.dispatch.core import RouterCore
from router.metrics import RouterMetrics
from router.predictors.base import PredictorSet
from router.request import (AUTO_MODEL, Kind, ParsedRequest, RequestError, context_error,
                            parse_request, upstream_body)
from router.tokenize import PromptInfo, Tokenizers
from router.types import Decision, NoEngineAvailable, Overloaded, RoutingRequest, WorkflowMeta
from router.upstream import (StreamResult, StreamTimeouts, Upstream, UpstreamError,
                             completion_tokens)

MAX_BODY_BYTES = 32 * 2**20
MAX_PROMPT_TOKENS = 1 << 20
"""Longest prompt taken for a model whose engines set no ``max_model_len`` (with one, the
context bounds it)."""
MAX_ROUTE_ATTEMPTS = 3
"""Routing attempts per request when the chosen engine cannot be reached or fails before
answering (``_redispatch``)."""
RUNNER_OPTIONS: dict[str, Any] = {"handler_cancellation": True, "access_log": None,
                                  "shutdown_timeout": 5.0}
"""``web.AppRunner`` options the front needs (the tests' servers use them too)."""
CLIENT_CLOSED = 499
"""Status counted for a request whose client left before the answer (never sent)."""

log = logging.getLogger(__name__)
_encode = msgspec.json.encode
_ids = itertools.count(1)
_ID_PREFIX = os.urandom(8).hex()


def request_id() -> str:
    """A new request id, unique across router processes and restarts: a random prefix
    per process and a counter (``uuid4`` reads the OS's random source per call)."""
    return f"{_ID_PREFIX}{next(_ids):x}"


class ClientDisconnected(Exception):
    """The client went away before the response was complete."""


@dataclass(frozen=True)
class ServedModel:
    """A served model name, its model spec and the smallest context among its replicas
    (``None`` when no replica sets ``max_model_len``: the engines then check it)."""

    name: str
    spec: str
    max_model_len: int | None


def served_models(config: ClusterConfig) -> dict[str, ServedModel]:
    """Every served model name of the cluster, with the model whose tokenizer it uses."""
    instances = config.instances()
    out: dict[str, ServedModel] = {}
    for name in dict.fromkeys(i.served_model_name for i in instances):
        replicas = [i for i in instances if i.served_model_name == name]
        specs = [i.model for i in replicas if i.model is not None]
        if not specs:
            raise ConfigError(config.source, f"engines.{replicas[0].engine}.model",
                              f"not set; the router needs the model of '{name}' to load "
                              "its tokenizer")
        lengths = [i.max_model_len for i in replicas if i.max_model_len is not None]
        out[name] = ServedModel(name, specs[0], min(lengths) if lengths else None)
    return out


def load_configured_predictors(config: ClusterConfig) -> PredictorSet | None:
    """The artifacts and profiles of ``[router.predictors]``, the learned ones behind the
    batched predictor service, or ``None`` when the file names none. ArtifactError (a
    ValueError) on any mismatch (docs/predictors.md)."""
    if not config.router.predictors:
        return None
    from router.predictors.loader import load_cluster_predictors  # heavy: only if configured

    return load_cluster_predictors(config)


def close_configured_predictors(predictors: PredictorSet) -> None:
    """Stop the batched predictor service, if one was started."""
    if predictors.semantic_router or predictors.length or predictors.knn \
            or predictors.capability:
        from router.predictors.loader import close_predictors

        close_predictors(predictors)


def _json(body: Any, status: int = 200,
          headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_encode(body), status=status, headers=headers,
                        content_type="application/json")


def _error(exc: RequestError) -> web.Response:
    headers = None if exc.retry_after_s is None else {"retry-after": str(exc.retry_after_s)}
    return _json(exc.body(), exc.status, headers)


@web.middleware
async def openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own 404 and 405 as OpenAI error objects, which clients' SDKs parse (the
    path is not echoed: it may hold anything)."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        what = "no such endpoint" if exc.status == 404 else \
            f"{request.method[:16]} is not allowed here"
        return _error(RequestError(exc.status, what, code="not_found" if exc.status == 404
                                   else "method_not_allowed"))


def overloaded(why: str) -> RequestError:
    """The 503 of a request the router sheds; the client should retry a second later."""
    return RequestError(503, f"the router is overloaded: {why}; retry later",
                        type_="service_unavailable", code="overloaded", retry_after_s=1)


async def read_body(content: aiohttp.StreamReader) -> bytes:
    """The request body, at most ``MAX_BODY_BYTES`` (413 beyond); ClientDisconnected if
    the client leaves while sending."""
    chunks, size = [], 0
    try:
        async for chunk in content.iter_any():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise RequestError(413, f"request body exceeds {MAX_BODY_BYTES} bytes",
                                   code="body_too_large")
            chunks.append(chunk)
    except (aiohttp.ClientPayloadError, ConnectionError):  # nobody left to answer
        raise ClientDisconnected() from None
    return b"".join(chunks)


class _Completion:
    """Reports one routed request's end to the core, exactly once."""

    def __init__(self, core: RouterCore, decision: Decision) -> None:
        self._core, self.decision, self._done = core, decision, False

    def finish(self, output_tokens: int, error: str | None) -> None:
        if not self._done:
            self._done = True
            self._core.on_complete(self.decision, output_tokens, error)


class Front:
    """Request handling state shared by the endpoints (``app[FRONT]``)."""

    def __init__(self, config: ClusterConfig, core: RouterCore | None = None,
                 worker: int | None = None) -> None:
        self.config = config
        r = config.router
        self.keys = Keys(load_keys(r.api_keys_file, r.api_keys_env, "router API keys"),
                         load_keys(r.admin_keys_file, r.admin_keys_env, "router admin keys"),
                         load_keys(r.trusted_keys_file, r.trusted_keys_env,
                                   "router trusted keys"))
        self.core = core or RouterCore(config, load_configured_predictors(config),
                                       worker=worker)
        self.metrics = RouterMetrics(self.core, config.router.policy)
        self.engine_auth = _engine_auth(config.instances())
        self.models = served_models(config)
        self.tokenizers = Tokenizers({m.name: m.spec for m in self.models.values()})
        self.upstream: Upstream | None = None
        self.tokenize_always = True
        """Tokenize every prompt (the policy reads it); else only when it may not fit."""
        self.new_request_id: Callable[[], str] = request_id
        """Request ids (the twin numbers its requests)."""
        self.created = int(time.time())
        self.inflight = 0
        """Generation requests being handled (``[router] max_inflight`` bounds it)."""

    def prepare(self) -> None:
        """What routing needs, blocking and with no socket: the tokenizers loaded and the
        policy built (ValueError: bad settings). ``startup`` runs it, then starts the
        core's streams; the twin (``kernels_bench.twin``) runs only this."""
        self.tokenizers.load()
        if not self.tokenizers.same_tokenizer(list(self.models)):
            log.warning("served models use different tokenizers: 'auto' requests are "
                        "tokenized with %s's, KV prefix estimates for the others are "
                        "approximate", next(iter(self.models)))
        self.tokenize_always = self.core.build_policy().uses_prompt

    async def startup(self, _app: web.Application) -> None:
        await asyncio.to_thread(self.prepare)
        await self.core.start()
        r = self.config.router
        self.upstream = Upstream(r.request_timeout_s, r.max_inflight,
                                 StreamTimeouts(r.stream_first_byte_timeout_s,
                                                r.stream_stall_timeout_s))
        gc.collect()
        gc.freeze()  # tokenizers, templates, predictors: never garbage, never scanned again

    async def cleanup(self, _app: web.Application) -> None:
        if self.upstream is not None:
            await self.upstream.aclose()
        await self.core.stop()
        close_configured_predictors(self.core.predictors)

    # ------------------------------------------------------------ plain endpoints

    async def list_models(self, request: web.Request) -> web.Response:
        try:
            self.keys.check_api(request.headers)
        except RequestError as exc:
            return _error(exc)
        data = [{"id": m.name, "object": "model", "created": self.created,
                 "owned_by": "hetserve", "max_model_len": m.max_model_len}
                for m in self.models.values()]
        data.append({"id": AUTO_MODEL, "object": "model", "created": self.created,
                     "owned_by": "hetserve", "max_model_len": None})
        return _json({"object": "list", "data": data})

    async def health(self, _request: web.Request) -> web.Response:
        engines = self.core.engines()
        up = sum(1 for e in engines if e.up)
        body = {"status": "ok" if up else "no engine up", "engines_up": up,
                "engines": len(engines),
                "instances": [{"name": e.name, "model": e.model, "up": e.up,
                               "inflight": self.core.open_requests[e.name], "url": e.url,
                               "node": self.core.nodes.get(e.name)} for e in engines]}
        return _json(body, 200 if up else 503)

    async def metrics_endpoint(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={
            "content-type": "text/plain; version=0.0.4; charset=utf-8"})

    async def admin(self, request: web.Request) -> web.Response:
        """``POST /admin/engines/{instance}/down|up``: the launcher's health verdicts;
        ``.../move?url=http://HOST:PORT[&node=N]``: it restarted the engine elsewhere;
        ``.../add`` (body: the engine's cluster-file entry, with ``url``): it started one
        more replica of a served model; ``.../remove``: it drained (marked down, nothing
        in flight) and stops one."""
        if not self.keys.admin_allowed(request.headers, self._local(request)):
            return _error(RequestError(403, "admin endpoints need an admin key"
                                       if self.keys.admin else "admin endpoints answer only "
                                       "on loopback and unix-socket listeners",
                                       type_="permission_error"))
        name, state = request.match_info["instance"], request.match_info["state"]
        instances = self.core.instances
        if state == "add" and name not in instances:
            return await self._admin_add(request, name)
        if state not in ("up", "down", "move", "remove") or name not in instances:
            return _error(RequestError(404, f"no engine instance '{name}' (known: "
                                       f"{', '.join(instances)}) or action '{state}' "
                                       "(up, down, move, add, remove)", code="not_found"))
        if state == "remove":
            try:
                await self.core.admin_remove(name)
            except ValueError as exc:
                return _error(RequestError(409, str(exc), code="conflict"))
            self.engine_auth.pop(name, None)
            return _json({"instance": name, "removed": True})
        if state == "move":
            url = request.query.get("url", "")
            try:
                self.core.admin_move(name, url, request.query.get("node"))
            except ValueError as exc:
                return _error(RequestError(400, str(exc), param="url"))
            return _json({"instance": name, "url": self.core.table[name].url,
                          "node": self.core.nodes.get(name)})
        reason = request.query.get("reason", "admin")
        self.core.admin_mark(name, state == "up", reason)
        return _json({"instance": name, "up": state == "up", "reason": reason})

    async def _admin_add(self, request: web.Request, name: str) -> web.Response:
        try:
            entry = msgspec.json.decode(await read_body(request.content))
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as exc:
            return _error(RequestError(400, f"the body must be a JSON object: {exc}"))
        if not isinstance(entry, dict) or entry.get("name") != name:
            return _error(RequestError(400, f"the body must be the engine's entry, a JSON "
                                       f"object with \"name\": \"{name}\"", param="name"))
        try:
            if isinstance(env := entry.get("api_key_env"), str):
                engine_key(name, env)  # its key must be here before anything routes to it
            inst = self.core.admin_add(entry)
        except ValueError as exc:  # ConfigError, KeysError
            return _error(RequestError(400, str(exc)))
        return _json({"instance": inst.name, "url": inst.url, "model": inst.served_model_name,
                      "node": inst.node})

    def _auth(self, instance: str) -> str | None:
        """The ``Authorization`` value for ``instance`` (an added engine's on first use)."""
        auth = self.engine_auth.get(instance)
        inst = self.core.instances.get(instance)
        if auth is None and inst is not None and inst.api_key_env:
            auth = self.engine_auth[instance] = _engine_auth([inst])[instance]
        return auth

    def _local(self, request: web.Request) -> bool:
        transport = request.transport
        if transport is None:
            return False
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            return True
        peer = transport.get_extra_info("peername")
        return (is_loopback(self.config.router.host) and isinstance(peer, tuple)
                and is_loopback(peer[0]))

    # ------------------------------------------------------------ generation

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        limit = self.config.router.max_inflight
        if self.inflight >= limit:
            self.metrics.requests.labels(request.path, "503").inc()
            return _error(overloaded(f"{limit} requests in flight (router.max_inflight)"))
        self.inflight += 1
        status = CLIENT_CLOSED
        try:
            response = await self._dispatch(request, kind)
            status = response.status
            return response
        except RequestError as exc:
            status = exc.status
            return _error(exc)
        except ClientDisconnected:  # nobody to answer: counted, never sent
            return web.Response(status=CLIENT_CLOSED)
        finally:  # also when the client's leaving cancelled us
            self.inflight -= 1
            self.metrics.requests.labels(request.path, str(status)).inc()

    async def _dispatch(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        parsed, routing = await self.admit(kind, request.headers,
                                           lambda: read_body(request.content))
        attempt = 1
        while True:
            completion = _Completion(self.core, await self.route(routing))
            try:
                return await self._forward(request, parsed, routing.request_id, completion)
            except UpstreamError as exc:
                if not _redispatch(exc) or attempt == MAX_ROUTE_ATTEMPTS:
                    raise exc.error() from None
            self.metrics.redispatched.inc()
            attempt += 1

    async def admit(self, kind: Kind, headers: Mapping[str, str],
                    read: Callable[[], Awaitable[bytes]]
                    ) -> tuple[ParsedRequest, RoutingRequest]:
        """A request authenticated (before ``read`` gives its body), validated, tokenized
        (when the policy reads the prompt, or it may not fit) and made the core's
        request; RequestError (4xx) otherwise. The twin (``kernels_bench.twin``) calls
        this as the HTTP handler does."""
        arrival = self.core.wall_clock()
        trusted = self.keys.check_api(headers)
        parsed = parse_request(kind, await read(), headers,
                               allow_client_priority=self.config.router.allow_client_priority,
                               trusted=trusted)
        for name in parsed.ignored:
            self.metrics.untrusted_fields.labels(name).inc()
        self._check_per_model(parsed)
        return parsed, self._routing_request(parsed, await self._prompt(parsed), arrival,
                                             self.new_request_id())

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
                               param="messages" if parsed.kind == "chat" else "prompt",
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

    @staticmethod
    def _routing_request(parsed: ParsedRequest, prompt: PromptInfo | None,
                         arrival: float, rid: str) -> RoutingRequest:
        """The core's request; without ``prompt`` (not tokenized), an empty prompt of
        0 tokens: every engine it may go to fits it, and its policy reads none of it."""
        if prompt is None:
            return RoutingRequest(request_id=rid, requested_model=parsed.model,
                                  max_tokens=parsed.max_tokens,
                                  workflow=WorkflowMeta(**parsed.workflow),
                                  arrival_time=arrival)
        return RoutingRequest(
            request_id=rid,
            requested_model=parsed.model,
            prompt_text=prompt.text,
            system_text=prompt.system_text,
            user_text=prompt.user_text,
            prompt_token_ids=prompt.token_ids,
            num_prompt_tokens=len(prompt.token_ids),
            max_tokens=parsed.max_tokens,
            workflow=WorkflowMeta(**parsed.workflow),
            arrival_time=arrival,
        )

    async def route(self, routing: RoutingRequest) -> Decision:
        """The core's decision; its failures as RequestError (503, 429, 400, 500)."""
        try:
            return await self.core.route(routing)
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
            self.core.mark_engine(instance, False, str(exc), probe=True)

    async def _forward(self, request: web.Request, parsed: ParsedRequest, request_id: str,
                       completion: _Completion) -> web.StreamResponse:
        decision = completion.decision
        priority, max_tokens = engine_settings(parsed, decision)
        body = upstream_body(parsed, decision.model, priority, max_tokens)
        path = "/v1/chat/completions" if parsed.kind == "chat" else "/v1/completions"
        headers = {"content-type": "application/json", "x-request-id": request_id}
        auth = self._auth(decision.instance)
        if auth is not None:
            headers["authorization"] = auth
        response_headers = {"x-request-id": request_id, **_decision_headers(decision, priority)}
        assert self.upstream is not None
        try:
            resp = await self.upstream.open(decision.instance, decision.url.rstrip("/") + path,
                                            body, headers, parsed.stream)
            if parsed.stream and resp.status == 200:
                return await self._relay(request, completion, resp, parsed.include_usage,
                                         response_headers)
            content = await self.upstream.read(decision.instance, resp)
        except UpstreamError as exc:
            self._upstream_failed(completion, exc)
            raise
        except asyncio.CancelledError:  # the client left (or the router stops)
            completion.finish(0, "client disconnected")
            raise
        except BaseException:
            completion.finish(0, "aborted")
            raise
        error = None if resp.status < 400 else f"engine answered {resp.status}"
        completion.finish(completion_tokens(content) if error is None else 0, error)
        response_headers["content-type"] = resp.headers.get("content-type", "application/json")
        return web.Response(body=content, status=resp.status, headers=response_headers)

    async def _relay(self, request: web.Request, completion: _Completion,
                     resp: aiohttp.ClientResponse, keep_usage: bool,
                     headers: dict[str, str]) -> web.StreamResponse:
        """Relay an engine's SSE stream; report its end exactly once. A failure after
        the first byte ends the stream with an OpenAI error event and no ``[DONE]``."""
        result = StreamResult()
        instance = completion.decision.instance
        out = web.StreamResponse(status=200, headers={**headers,
                                                      "content-type": "text/event-stream"})
        error: str | None = "aborted"
        try:
            await out.prepare(request)
            assert self.upstream is not None
            async for event in self.upstream.events(instance, resp, result, keep_usage):
                await out.write(event)
            await out.write_eof()
            error = None
        except UpstreamError as exc:
            self._upstream_failed(completion, exc, result.output_tokens)
            try:
                await out.write(b"data: " + _encode(exc.error().body()) + b"\n\n")
                await out.write_eof()
            except (ConnectionError, RuntimeError):
                pass
        except (ConnectionError, asyncio.CancelledError) as exc:
            error = "client disconnected"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            completion.finish(result.output_tokens, error)
            resp.release()
        return out


FRONT = web.AppKey("front", Front)


def engine_settings(parsed: ParsedRequest, decision: Decision) -> tuple[int | None, int | None]:
    """(priority, max_tokens) sent to the engine: the client's priority (when allowed),
    else its ``per_model.priority`` for the chosen model, else the policy's; the client's
    ``per_model.max_tokens`` for the chosen model within the policy's clamp."""
    priority = parsed.client_priority
    if priority is None:
        priority = parsed.model_priority.get(decision.model, decision.priority)
    max_tokens = decision.max_tokens
    forced = parsed.model_max_tokens.get(decision.model)
    if forced is not None:
        max_tokens = forced if max_tokens is None else min(forced, max_tokens)
    return priority, max_tokens


def _engine_auth(instances: Iterable[EngineInstance]) -> dict[str, str]:
    """The ``Authorization`` value of each engine that requires an API key
    (``api_key_env``; KeysError, a ValueError, when its variable is not set)."""
    return {inst.name: f"Bearer {engine_key(inst.engine, inst.api_key_env)}"
            for inst in instances if inst.api_key_env}


def _redispatch(exc: UpstreamError) -> bool:
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


def create_app(config: ClusterConfig, core: RouterCore | None = None,
               worker: int | None = None) -> web.Application:
    """The router's aiohttp app (``core`` defaults to ``RouterCore(config)``, as router
    worker ``worker`` when ``router.workers`` > 1); serve it with ``RUNNER_OPTIONS``."""
    front = Front(config, core, worker)
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors])
    app.router.add_post("/v1/chat/completions", front.chat)
    app.router.add_post("/v1/completions", front.completions)
    app.router.add_get("/v1/models", front.list_models, allow_head=False)
    app.router.add_get("/health", front.health, allow_head=False)
    app.router.add_get("/metrics", front.metrics_endpoint, allow_head=False)
    app.router.add_post("/admin/engines/{instance}/{state}", front.admin)
    app.on_startup.append(front.startup)
    app.on_cleanup.append(front.cleanup)
    app[FRONT] = front
    return app
