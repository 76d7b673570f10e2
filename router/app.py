"""The router's aiohttp app: ``create_app(config)`` over a ``RouterCore``.

A request crosses three plain steps: a thin route (``router.routes``: the OpenAI API in
``openai``, the launcher's admin API in ``admin``), admission (``router.admission``:
authenticated, decoded once into typed structs, tokenized when the policy reads the prompt
or it may not fit, made the core's ``RoutingRequest``) and the proxy (``router.proxy``:
the core's decision, the engine call with the chosen ``model``, ``priority`` and
``max_tokens``, the relayed answer, re-dispatch to another engine, the completion reported
to the core exactly once). ``Front`` holds what they share and starts and stops it.

Serve it with ``RUNNER_OPTIONS`` (``router.__main__``): a client that disconnects
cancels its handler, which is how an abandoned request is noticed and reported.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from aiohttp import web

from router.admission.admit import Admission
from router.admission.served import served_models
from router.auth import Keys, load_keys
from router.config.cluster import ClusterConfig
from router.dispatch.core import RouterCore
from router.engine_client import EngineClient
from router.metrics import RouterMetrics
from router.predictors.base import PredictorSet
from router.proxy import Proxy
from router.request import Kind, request_id
from router.routes.admin import AdminRoutes
from router.routes.http import MAX_BODY_BYTES
from router.routes.openai import OpenAIRoutes, openai_errors
from router.routes.outcomes import OutcomeRoutes
from router.tokenize import Tokenizers

RUNNER_OPTIONS: dict[str, Any] = {"handler_cancellation": True, "access_log": None,
                                  "shutdown_timeout": 5.0}
"""``web.AppRunner`` options the front needs (the tests' servers use them too)."""

log = logging.getLogger(__name__)


def load_configured_predictors(config: ClusterConfig) -> PredictorSet | None:
    """The artifacts and profiles of ``[router.predictors]``, the learned ones behind the
    batched predictor service, or ``None`` when the file names none. ArtifactError (a
    ValueError) on any mismatch (docs/research/predictors.md)."""
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


class Front:
    """What the routes share (``app[FRONT]``): the core, admission and the proxy, and the
    request path through them (``handle``)."""

    def __init__(self, config: ClusterConfig, core: RouterCore | None = None,
                 worker: int | None = None, engine_client: EngineClient | None = None,
                 request_ids: Callable[[], str] = request_id) -> None:
        """``engine_client``: how requests reach the engines (None: HTTP,
        ``router.upstream``); ``request_ids``: the request ids admission gives."""
        r = config.router
        self.config = config
        self.keys = Keys(load_keys(r.api_keys_file, r.api_keys_env, "router API keys"),
                         load_keys(r.admin_keys_file, r.admin_keys_env, "router admin keys"),
                         load_keys(r.trusted_keys_file, r.trusted_keys_env,
                                   "router trusted keys"))
        self.core = core or RouterCore(config, load_configured_predictors(config),
                                       worker=worker)
        self.metrics = RouterMetrics(self.core, r.policy)
        self.models = served_models(config)
        self.tokenizers = Tokenizers({m.name: m.spec for m in self.models.values()})
        self.admission = Admission(r, self.keys, self.models, self.tokenizers, self.metrics,
                                   self.core.state, self.core.routing.clock,
                                   self.core.routing.wall_clock, request_ids)
        self.proxy = Proxy(r, self.core, self.metrics, engine_client, request_ids)
        self.created = int(time.time())

    async def handle(self, kind: Kind, headers: Mapping[str, str],
                     read: Callable[[], Awaitable[bytes]],
                     request: web.BaseRequest | None = None) -> web.StreamResponse:
        """One generation request, as its route hands it on: admitted (authenticated
        before ``read`` gives its body, decoded, tokenized when needed), routed and
        forwarded; the engine's answer. RequestError when refused. ``request``: the HTTP
        request a streamed answer is written to."""
        parsed, routing = await self.admission.admit(kind, headers, read)
        return await self.proxy.serve(request, parsed, routing)

    async def start(self) -> None:
        """Ready to route: the tokenizers loaded and the policy built off the event loop
        (ValueError: bad settings), the core's telemetry started, the engine client
        opened."""
        await asyncio.to_thread(self._load)
        await self.core.start()
        self.proxy.start()

    async def stop(self) -> None:
        await self.proxy.close()
        await self.core.stop()

    def _load(self) -> None:
        self.tokenizers.load()
        if not self.tokenizers.same_tokenizer(list(self.models)):
            log.warning("served models use different tokenizers: 'auto' requests are "
                        "tokenized with %s's, KV prefix estimates for the others are "
                        "approximate", next(iter(self.models)))
        policy = self.core.build_policy()
        self.admission.tokenize_always = policy.uses_prompt
        self.admission.find_programs = policy.program_affinity

    async def startup(self, _app: web.Application) -> None:
        await self.start()
        gc.collect()
        gc.freeze()  # tokenizers, templates, predictors: never garbage, never scanned again

    async def cleanup(self, _app: web.Application) -> None:
        await self.stop()
        close_configured_predictors(self.core.routing.predictors)


FRONT = web.AppKey("front", Front)


def create_app(config: ClusterConfig, core: RouterCore | None = None,
               worker: int | None = None) -> web.Application:
    """The router's aiohttp app (``core`` defaults to ``RouterCore(config)``, as router
    worker ``worker`` when ``router.workers`` > 1); serve it with ``RUNNER_OPTIONS``."""
    front = Front(config, core, worker)
    r = config.router
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors])
    OpenAIRoutes(r, front.keys, front.admission, front.handle, front.proxy.pass_through,
                 front.core, front.metrics, front.created).add_to(app)
    AdminRoutes(r, front.keys, front.core, front.proxy).add_to(app)
    OutcomeRoutes(front.keys, front.core, front.metrics).add_to(app)
    app.on_startup.append(front.startup)
    app.on_cleanup.append(front.cleanup)
    app[FRONT] = front
    return app
