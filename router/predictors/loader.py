"""``load_predictors``: the router's predictor set from cluster.toml's artifact paths.

Keys of ``[router.predictors]``: ``semantic_router``, ``length``, ``knn``, ``tpot``,
``capability`` (artifacts of ``python -m router.train``) and ``profiles`` (a JSON file
mapping each served model to its decode profile: ``decode_ms_per_token``,
``max_batch_size`` and optionally ``mean_output_tokens``). Every artifact must know every
served model (``tpot``: every engine) and may be pinned to feature settings; a mismatch
is an ``ArtifactError`` at start-up. With ``service`` settings, each of the four
asynchronous predictors runs in-process when one call costs at most
``ServiceSettings.inline_max_ms`` (timed at start-up: ``placement``), else behind one
batched worker-pool service; without, all in-process.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from router.predictors.artifact import ArtifactError, check_covers, read_metadata
from router.predictors.base import ModelProfile, PredictorSet
from router.predictors.features import RequestFeatures
from router.predictors.kinds import KINDS, kind
from router.predictors.service import SERVED, PredictorService, Served, ServiceSettings

PROFILES = "profiles"
log = logging.getLogger(__name__)

PROBE = RequestFeatures(
    system_text="You are a careful assistant. Think step by step.",
    user_text=("A bakery sells 3 kinds of bread. On Monday it sold 14 loaves of rye, twice "
               "as many loaves of wheat, and 5 fewer loaves of sourdough than wheat. Write "
               "a Python function that returns the total number of loaves sold, then "
               "explain each step of the computation. ") * 3,
    prompt_text="", prompt_tokens=300, workflow="", stage="", stage_index=0)
"""The request ``placement`` times: 180 user tokens (MiniLM's tokenizer), the 90th
percentile of the shipped traces' first prompts (median 94)."""


def call_ms(predictor: Any, probes: int = 5) -> float:
    """Median milliseconds of one ``predict`` call on ``PROBE`` (after one warm-up)."""
    predictor.predict([PROBE])
    times = []
    for _ in range(probes):
        t0 = time.perf_counter()
        predictor.predict([PROBE])
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def placement(predictors: Mapping[str, Any]) -> dict[str, float]:
    """The cost per call of each loaded predictor that the service could run, timed here
    (those above ``ServiceSettings.inline_max_ms`` go to the pool)."""
    return {name: call_ms(obj) for name, obj in predictors.items() if name in SERVED}


def load_profiles(path: str, models: Sequence[str]) -> dict[str, ModelProfile]:
    """Decode profiles by served model; ArtifactError naming what is missing or wrong."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        profiles = {m: ModelProfile(**v) for m, v in raw.items()}
    except (OSError, json.JSONDecodeError, TypeError, AttributeError) as e:
        raise ArtifactError(f"profiles {path!r}: expected a JSON object of model -> "
                            f"{{decode_ms_per_token, max_batch_size[, mean_output_tokens]}} "
                            f"({e})") from None
    missing = sorted(set(models) - set(profiles))
    if missing:
        raise ArtifactError(f"profiles {path!r}: no profile for {', '.join(missing)}")
    return profiles


def _load(name: str, path: str, expected: Mapping[str, Any] | None) -> Any:
    """The artifact in-process; any failure to load it is an ArtifactError naming it."""
    try:
        return kind(name).predictor.load(path, expected)
    except ArtifactError:
        raise
    except Exception as e:
        raise ArtifactError(f"cannot load {name} {path!r}: {type(e).__name__}: {e}") from None


def load_predictors(paths: Mapping[str, str], models: Sequence[str],
                    engines: Sequence[str] = (), service: ServiceSettings | None = None,
                    expected: Mapping[str, Mapping[str, Any]] | None = None) -> PredictorSet:
    """Load and check every configured predictor (``expected``: feature settings to pin
    per predictor name). Raises ArtifactError on an unknown name or any mismatch."""
    unknown = sorted(set(paths) - set(KINDS) - {PROFILES})
    if unknown:
        raise ArtifactError(f"router.predictors: unknown predictor(s) {', '.join(unknown)}; "
                            f"known: {', '.join([*KINDS, PROFILES])}")
    pset = PredictorSet()
    metas = {}
    for name, path in paths.items():
        if name == PROFILES:
            pset.profiles = load_profiles(path, models)
            continue
        meta = metas[name] = read_metadata(path, name, (expected or {}).get(name))
        if name == "tpot":
            check_covers(meta, path, "engines", meta.engines, engines)
        else:
            check_covers(meta, path, "models", meta.models, models)
    local = {name: _load(name, paths[name], (expected or {}).get(name)) for name in metas}
    costs = placement(local) if service is not None else {}
    limit = service.inline_max_ms if service is not None else 0.0
    served = {n: paths[n] for n, ms in costs.items() if ms > limit}
    for name, ms in sorted(costs.items()):
        log.info("predictor %s: %.2f ms per call, runs %s", name, ms,
                 "in the worker pool" if name in served else "in the router process")
    svc = PredictorService(served, service) if served and service is not None else None
    if svc is not None:
        svc.start()
    for name, meta in metas.items():
        setattr(pset, name, SERVED[name](svc, name, meta.models) if name in served
                else local[name])
    pset.call_ms = costs
    return pset


def load_cluster_predictors(config: Any, service: ServiceSettings | None = ServiceSettings()
                            ) -> PredictorSet | None:
    """The predictors of a cluster file's ``[router.predictors]`` (``None`` when it names
    none), checked against its served models and engine instances, behind the batched
    service (``service=None``: in-process, for offline tools). ArtifactError on any
    mismatch; close with ``close_predictors``."""
    if not config.router.predictors:
        return None
    instances = config.instances()
    return load_predictors(config.router.predictors,
                           sorted({i.served_model_name for i in instances}),
                           [i.name for i in instances], service)


def close_predictors(pset: PredictorSet) -> None:
    """Stop the batched service behind ``pset``, if any."""
    for name in KINDS:
        obj = getattr(pset, name)
        if isinstance(obj, Served):
            obj.service.close()
            return
