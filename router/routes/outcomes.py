"""``POST /v1/hetserve/outcomes``: an agent says how a program, or one of its stages,
ended (issue 59), for a policy that learns from outcomes (``online``).

Body (JSON, at most ``MAX_OUTCOME_BYTES``)::

    {"program_id": "p-17", "stage": "solve", "passed": true}
    {"program_id": "p-17", "score": 0.5}

``program_id`` as the workflow's (1 to 1024 characters); ``stage`` optional (the stage
name, or the stage index as a string, as the calls sent it; none: the program's outcome,
which judges the call that chose its model); exactly one of ``passed`` (bool) and
``score`` (a number in [0, 1]). The API keys are the OpenAI routes' (``router.auth.Keys``).
Answer 200 ``{"verdict": ...}``: ``accepted`` (credited), ``duplicate`` (that call was
credited already), ``unknown`` (no such program routed here), ``late`` (routed here but
forgotten), ``ignored`` (the policy does not learn from outcomes); 400 for a bad body,
401 without a key. Every answer is counted in ``hetserve_outcomes_total{verdict}``
(``invalid`` for a 400), with the retries' failures (``retry_failure``).
"""

from __future__ import annotations

from typing import Annotated, Iterator

import aiohttp
import msgspec
from aiohttp import web
from msgspec import Meta, Struct
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from router.auth import Keys
from router.dispatch.core import RouterCore
from router.metrics import RouterMetrics
from router.request import Label, RequestError
from router.routes.http import ClientDisconnected, error_response, json_response
from router.state.outcomes import VERDICTS, OutcomeBook

MAX_OUTCOME_BYTES = 8192
"""Largest body an outcome may have."""
PATH = "/v1/hetserve/outcomes"


class Outcome(Struct, frozen=True, forbid_unknown_fields=True):
    program_id: Label
    stage: Label | None = None
    passed: bool | None = None
    score: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None


_decode = msgspec.json.Decoder(Outcome).decode


class OutcomeRoutes(Collector):
    """The outcome route and its counter (a collector of the front's registry)."""

    def __init__(self, keys: Keys, core: RouterCore, metrics: RouterMetrics) -> None:
        self.keys, self.core = keys, core
        self.counts = {"invalid": 0, "ignored": 0}
        metrics.registry.register(self)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post(PATH, self.outcome)

    def book(self) -> OutcomeBook | None:
        book = getattr(self.core.routing.policy, "book", None)
        return book if isinstance(book, OutcomeBook) else None

    async def outcome(self, request: web.Request) -> web.Response:
        try:
            self.keys.check_api(request.headers)
            o = _decode(await _read(request))
            if (o.passed is None) == (o.score is None):
                raise RequestError(400, "give exactly one of 'passed' and 'score'",
                                   param="passed")
        except RequestError as exc:
            if exc.status != 401:
                self.counts["invalid"] += 1
            return error_response(exc)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError) as exc:
            self.counts["invalid"] += 1
            return error_response(RequestError(400, f"bad outcome: {str(exc)[:200]}",
                                               code="invalid_outcome"))
        except ClientDisconnected:
            return web.Response(status=499)
        book = self.book()
        if book is None:
            self.counts["ignored"] += 1
            return json_response({"verdict": "ignored"})
        score = float(o.passed) if o.score is None else o.score
        return json_response({"verdict": book.report(o.program_id, o.stage, score)})

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("hetserve_outcomes", "agents' outcomes by verdict "
                                     "(accepted, duplicate, unknown, late; retry_failure: a "
                                     "model a retry named as tried; invalid: refused body; "
                                     "ignored: the policy does not learn)", labels=["verdict"])
        book = self.book()
        for v in VERDICTS:
            family.add_metric([v], 0 if book is None else book.counts[v])
        for v, n in self.counts.items():
            family.add_metric([v], n)
        yield family


async def _read(request: web.Request) -> bytes:
    """The body, at most ``MAX_OUTCOME_BYTES`` (413 beyond)."""
    if (request.content_length or 0) > MAX_OUTCOME_BYTES:
        raise RequestError(413, f"an outcome is at most {MAX_OUTCOME_BYTES} bytes",
                           code="body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > MAX_OUTCOME_BYTES:
                raise RequestError(413, f"an outcome is at most {MAX_OUTCOME_BYTES} bytes",
                                   code="body_too_large")
            chunks.append(chunk)
    except (aiohttp.ClientPayloadError, ConnectionError):
        raise ClientDisconnected() from None
    return b"".join(chunks)
