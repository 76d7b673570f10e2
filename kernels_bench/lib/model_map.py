"""The map from a cluster's served models to a trace's models (``--model-map``), shared by
the engine profile (``python -m kernels_bench profile --trace``) and the lab's replays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.predictors import sources


class ModelMapError(ValueError):
    """A bad ``--model-map`` value or a served model the trace cannot replay; the message
    says which and why."""


def parse_model_map(items: Sequence[str]) -> dict[str, str]:
    """``["a=X,b=Y", "c=Z"]`` -> ``{"a": "X", "b": "Y", "c": "Z"}`` (served -> trace)."""
    try:
        return sources.parse_model_map(items)
    except ValueError as e:
        raise ModelMapError(f"--model-map: {e}") from None


def resolve_model_map(served: Sequence[str], given: Mapping[str, str],
                      trace_models: Sequence[str]) -> dict[str, str]:
    """Trace model of every served model: as mapped (matched case-insensitively when the
    spelling is unique), else the trace model of the same name; ModelMapError otherwise."""
    unknown = sorted(set(given) - set(served))
    if unknown:
        raise ModelMapError(f"--model-map names {', '.join(unknown)}, which the cluster does "
                            f"not serve (served models: {', '.join(served)})")
    by_lower: dict[str, list[str]] = {}
    for m in trace_models:
        by_lower.setdefault(m.lower(), []).append(m)
    out = {}
    for name in served:
        want = given.get(name, name)
        if want in trace_models:
            out[name] = want
            continue
        matches = by_lower.get(want.lower(), [])
        if len(matches) != 1:
            problem = (f"is mapped to {want!r}, which is not a model of the trace"
                       if name in given else "is not a model of the trace; map it with "
                       "--model-map SERVED=TRACE_MODEL")
            raise ModelMapError(f"served model {name!r} {problem} (trace models: "
                                f"{', '.join(trace_models)})")
        out[name] = matches[0]
    return out
