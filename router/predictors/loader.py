"""``load_predictors``: the router's predictor set from cluster.toml's artifact paths.

Keys of ``[router.predictors]``: ``semantic_router``, ``length``, ``knn``, ``tpot``,
``capability`` (artifacts of ``python -m router.train``) and ``profiles`` (a JSON file
mapping each served model to its decode profile: ``decode_ms_per_token``,
``max_batch_size`` and optionally ``mean_output_tokens``). Every artifact must know every
served model (``tpot``: every engine) and may be pinned to feature settings; a mismatch
is an ``ArtifactError`` at start-up. With ``service`` settings, the four asynchronous
predictors run behind one batched worker-pool service; otherwise in-process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from router.predictors.artifact import ArtifactError, check_covers, read_metadata
from router.predictors.base import ModelProfile, PredictorSet
from router.predictors.kinds import KINDS, kind
from router.predictors.service import SERVED, PredictorService, Served, ServiceSettings

PROFILES = "profiles"


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
    served = {n: paths[n] for n in metas if n in SERVED}
    svc = PredictorService(served, service) if served and service is not None else None
    if svc is not None:
        svc.start()
    for name, meta in metas.items():
        obj = SERVED[name](svc, name, meta.models) if svc is not None and name in served \
            else kind(name).predictor.load(paths[name], (expected or {}).get(name))
        setattr(pset, name, obj)
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
