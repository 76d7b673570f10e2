"""The client routes: OpenAI's ``/v1/chat/completions``, ``/v1/completions``,
``/v1/responses`` (and a stored response's ``GET``, ``DELETE`` and ``/cancel``),
``/v1/models``; Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens``; and
``/health`` (readiness: 503 while no engine is up), ``/live`` (liveness: the router
answers) and ``/metrics``. A generation route bounds the requests in flight and hands the
request to the front's ``handle`` (``router.app``: admission, then the proxy); a call that
generates nothing goes to its engine as it came (``PassThrough``)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping

import msgspec
from aiohttp import web

from router.admission.admit import Admission
from router.admission.convert import type_name
from router.admission.parse import parse_json
from router.admission.programs import scope
from router.auth import Keys, bearer
from router.config.cluster import RouterConfig
from router.dispatch.core import RouterCore
from router.metrics import RouterMetrics
from router.request import AUTO_MODEL, Kind, RequestError, overloaded
from router.routes.http import ClientDisconnected, error_response, json_response, read_body

Handle = Callable[[Kind, Mapping[str, str], Callable[[], Awaitable[bytes]], web.BaseRequest],
                  Awaitable[web.StreamResponse]]
"""A generation request's path after its route (``router.app.Front.handle``): headers,
the body's reader and the HTTP request in; the answer out, RequestError when refused."""

PassThrough = Callable[[Kind, str, str, str, bytes], Awaitable[web.Response]]
"""``router.proxy.Proxy.pass_through``: (API, engine, method, path, body) -> answer."""

CLIENT_CLOSED = 499
"""Status counted for a request whose client left before the answer (never sent)."""


@web.middleware
async def openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own 404 and 405 as OpenAI error objects, which clients' SDKs parse (the
    path is not echoed: it may hold anything)."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        what = "no such endpoint" if exc.status == 404 else \
            f"{request.method[:16]} is not allowed here"
        return error_response(RequestError(exc.status, what, code="not_found"
                                           if exc.status == 404 else "method_not_allowed"))


class OpenAIRoutes:
    """The handlers of the OpenAI API and the plain endpoints."""

    def __init__(self, settings: RouterConfig, keys: Keys, admission: Admission,
                 handle: Handle, pass_through: PassThrough, core: RouterCore,
                 metrics: RouterMetrics, created: int) -> None:
        self.settings, self.keys, self.admission, self.handle = settings, keys, admission, handle
        self.pass_through = pass_through
        self.core, self.metrics, self.created = core, metrics, created
        self.inflight = 0
        """Generation requests being handled (``[router] max_inflight`` bounds it)."""

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/responses/{id}", self.stored_response, allow_head=False)
        app.router.add_delete("/v1/responses/{id}", self.stored_response)
        app.router.add_post("/v1/responses/{id}/cancel", self.stored_response)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_get("/v1/models", self.models, allow_head=False)
        app.router.add_get("/health", self.health, allow_head=False)
        app.router.add_get("/live", self.live, allow_head=False)
        app.router.add_get("/metrics", self.metrics_text, allow_head=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "responses")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "messages")

    async def stored_response(self, request: web.Request) -> web.StreamResponse:
        """A stored response's ``GET``, ``DELETE`` or ``/cancel``, at the engine that
        stored it (404 when the router does not know it, or it is another API key's)."""
        path = "/v1/responses/" + request.match_info["id"] + (
            "/cancel" if request.path.endswith("/cancel") else "")
        try:
            self.keys.check_api(request.headers)
            stored = self.core.state.responses.find(
                request.match_info["id"], scope(bearer(request.headers), None),
                self.core.routing.clock())
            if stored is None:
                raise RequestError(404, "no response of this id is known to this router",
                                   param="response_id", code="response_not_found")
            query = f"?{request.query_string}" if request.query_string else ""
            return await self.pass_through("responses", stored.engine, request.method,
                                           path + query, b"")
        except RequestError as exc:
            return error_response(exc)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        """Messages' token count, from the least busy engine of the named model (the
        first served model's for ``auto``)."""
        try:
            self.keys.check_api(request.headers)
            body = parse_json(await read_body(request.content))
            model = body.get("model")
            models = self.core.state.table.models
            if model in (None, AUTO_MODEL):
                model = next(iter(self.admission.models))
            if not isinstance(model, str) or model not in models:
                shown = model[:100] if isinstance(model, str) else f"<{type_name(model)}>"
                raise RequestError(404, f"model '{shown}' does not exist; served "
                                   f"models: {', '.join(self.admission.models)}",
                                   param="model", code="model_not_found")
            up = [e for e in models[model] if e.down_reason is None]
            if not up:
                raise RequestError(503, f"no engine of '{model}' is up",
                                   type_="service_unavailable", code="no_engine_available",
                                   retry_after_s=1)
            engine = min(up, key=lambda e: self.core.state.open_requests[e.name]).name
            return await self.pass_through("messages", engine, "POST", request.path,
                                           msgspec.json.encode({**body, "model": model}))
        except RequestError as exc:
            return error_response(exc, "messages")
        except ClientDisconnected:
            return web.Response(status=CLIENT_CLOSED)

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        limit = self.settings.max_inflight
        if self.inflight >= limit:
            self.metrics.requests.labels(request.path, "503").inc()
            return error_response(overloaded(f"{limit} requests in flight "
                                             "(router.max_inflight)"), kind)
        self.inflight += 1
        status = CLIENT_CLOSED
        try:
            response = await self.handle(kind, request.headers,
                                         lambda: read_body(request.content), request)
            status = response.status
            return response
        except RequestError as exc:
            status = exc.status
            return error_response(exc, kind)
        except ClientDisconnected:  # nobody to answer: counted, never sent
            return web.Response(status=CLIENT_CLOSED)
        finally:  # also when the client's leaving cancelled us
            self.inflight -= 1
            self.metrics.requests.labels(request.path, str(status)).inc()

    async def models(self, request: web.Request) -> web.Response:
        try:
            self.keys.check_api(request.headers)
        except RequestError as exc:
            return error_response(exc)
        data = [{"id": m.name, "object": "model", "created": self.created,
                 "owned_by": "hetserve", "max_model_len": m.max_model_len}
                for m in self.admission.models.values()]
        data.append({"id": AUTO_MODEL, "object": "model", "created": self.created,
                     "owned_by": "hetserve", "max_model_len": None})
        return json_response({"object": "list", "data": data})

    async def health(self, _request: web.Request) -> web.Response:
        membership, state = self.core.membership, self.core.state
        engines = membership.engines()
        up = sum(1 for e in engines if e.up)
        body = {"status": "ok" if up else "no engine up", "engines_up": up,
                "engines": len(engines),
                "instances": [{"name": e.name, "model": e.model, "up": e.up,
                               "kind": membership.instances[e.name].kind,
                               "inflight": state.open_requests[e.name], "url": e.url,
                               "node": membership.nodes.get(e.name)} for e in engines]}
        return json_response(body, 200 if up else 503)

    async def live(self, _request: web.Request) -> web.Response:
        """200 whenever the router's event loop answers, engines up or not: what a
        supervisor restarts on (``/health``'s 503 with every engine down is no reason to
        restart the router)."""
        return json_response({"status": "alive"})

    async def metrics_text(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={
            "content-type": "text/plain; version=0.0.4; charset=utf-8"})
