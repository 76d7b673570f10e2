"""``python -m kernels_bench artifacts``: every predictor the replay's policies need, trained
once on the shipped traces and cached.

Trains ``semantic_router`` and ``length`` (Chimera), ``knn`` (RouteBalance) and
``capability`` (LAAR) with ``router.train``'s defaults (the papers') on the training split of
the given traces together (default: math and code), for the served models of the replay
cluster (``--model-map``), and writes ``OUT/<predictor>/``. An artifact is retrained only
when its cache key changes: the fingerprint of the rows it learns from, its settings, the
split and the model map (``--force`` retrains anyway). The replay's ``--artifacts OUT``
routes on them and replays only the problems their split held out.

``--folds K`` (``make artifacts``: 5) cross-fits: ``OUT/fold-k/<predictor>/`` for k < K,
fold k trained on every problem but those whose split hash falls in [k/K, (k+1)/K)
(``records.Split.fold``); the replay then replays every problem of the traces, each
under the fold that never saw it.

``--profile CLUSTER`` (``make artifacts``: the replay cluster) also profiles the cluster's
engines on this machine (``python -m kernels_bench profile``, into ``OUT/profile/``) and
trains RouteBalance's TPOT heads on that telemetry (``OUT/tpot/``). They learn engine
states, not problems, so one set serves every fold. The profile is redone only when the
cluster file's engine settings, the machine (CPU or GPU model, core count) or the vLLM and
torch versions change; the heads are retrained when the profile or their settings change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from kernels_bench.predictors.profile import (ERRORS, PROFILE_KEY_FILE, ProfileOptions, machine,
                                              profile_key, run_profile)
from router.predictors.artifact import METADATA_FILE
from router.predictors.kinds import kind, parse_settings
from router.predictors.records import Split
from router.predictors.sources import parse_model_map
from router.train import data_info, load_rows, train_artifact

PREDICTORS = ("semantic_router", "length", "knn", "capability")
DATA = ("data/traces/math.jsonl.gz", "data/traces/math-new.jsonl.gz",
        *(f"data/traces/math-new{i}.jsonl.gz" for i in range(2, 8)), "data/traces/code.jsonl.gz")
"""Every shipped greedy trace of the two Qwen models: math problems 0-799 and the code
problems (until 2026-11-29 only ``math.jsonl.gz`` and ``code.jsonl.gz``: pass those two as
``--data`` to remake the artifacts of results made before)."""
MODEL_MAP = "tiny-a=qwen2.5-coder-0.5b-instruct,tiny-b=qwen2.5-coder-1.5b-instruct"
"""The replay cluster's engines (examples/replay.toml) and the trace models they replay."""
OUT = Path("artifacts")


def cache_key(name: str, info: dict[str, Any], settings: Any) -> str:
    """sha256 over what an artifact depends on: predictor, rows, split, model map, settings."""
    what = {"predictor": name, "fingerprint": info["fingerprint"], "seed": info["seed"],
            "holdout": info["holdout"], "holdout_start": info["holdout_start"],
            "model_map": info.get("model_map", {}),
            "settings": dataclasses.asdict(settings)}
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def current_key(folder: Path) -> str | None:
    """The cache key of the artifact in ``folder``; None when absent or unreadable."""
    try:
        meta = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))
        return str(meta["data"]["cache_key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_tpot(cluster: Path, out: Path, sets: Sequence[str], force: bool = False,
               progress: bool = True, run_dir: Path | None = None) -> dict[str, str]:
    """Profile ``cluster``'s engines into ``out/profile`` unless a completed profile of the
    same file on the same machine is there, then train (or keep) the TPOT heads on its
    telemetry in ``out/tpot``; ``{"profile": ..., "tpot": ...}`` statuses. ``sets``:
    ``tpot.key=value`` settings; ``run_dir``: the engines' logs and sockets (default
    ``out/profile/cluster``). ValueError on bad input; a failed profile exits."""
    k = kind("tpot")
    settings = parse_settings(k.settings, [s.partition(".")[2] for s in sets
                                           if s.partition(".")[0] == "tpot"])
    key = profile_key(cluster, machine())
    prof, status = out / "profile", {}
    key_file = prof / PROFILE_KEY_FILE
    if not force and key_file.is_file() and key_file.read_text(encoding="utf-8") == key:
        print(f"profile: up to date ({prof})")
        status["profile"] = "up to date"
    else:
        try:
            run_profile(cluster, [], ProfileOptions(out=prof, run_dir=run_dir))
        except ERRORS as e:
            sys.exit(f"error: {e}")
        status["profile"] = "profiled"
    data = [str(prof / "telemetry.jsonl.gz")]
    rows = load_rows(k, data)
    info = data_info(data, rows, Split(0, 0.2))
    info["cache_key"] = cache_key("tpot", info, settings)
    if not force and current_key(out / "tpot") == info["cache_key"]:
        print(f"tpot: up to date ({out / 'tpot'})")
        status["tpot"] = "up to date"
    else:
        train_artifact(k, rows, settings, out / "tpot", info, progress)
        status["tpot"] = "trained"
    return status


def fold_dir(out: Path, k: int) -> Path:
    """Where fold ``k``'s artifacts go (``--folds``)."""
    return out / f"fold-{k}"


def build(names: Sequence[str], data: Sequence[str], model_map: Sequence[str], out: Path,
          split: Split, sets: Sequence[str], force: bool = False,
          progress: bool = True, rows: Sequence[Any] | None = None) -> dict[str, str]:
    """Train (or keep) every artifact of ``names`` (of ``PREDICTORS``) on the problems
    ``split`` keeps; ``{name: "trained" | "up to date"}``. ``sets``:
    ``predictor.key=value`` settings; ``rows``: ``load_rows`` of ``data`` when already
    loaded (every fold trains on the same rows). ValueError on bad input."""
    status: dict[str, str] = {}
    if rows is None:
        rows = load_rows(kind(names[0]), data, model_map)  # stage records: every kind
    for name in names:
        k = kind(name)
        own = [s.partition(".")[2] for s in sets if s.partition(".")[0] == name]
        settings = parse_settings(k.settings, own)
        info = data_info(data, rows, split)
        if model_map:
            info["model_map"] = parse_model_map(model_map)
        info["cache_key"] = cache_key(name, info, settings)
        folder = out / name
        if not force and current_key(folder) == info["cache_key"]:
            print(f"{name}: up to date ({folder})")
            status[name] = "up to date"
            continue
        train_artifact(k, rows, settings, folder, info, progress)
        status[name] = "trained"
    return status
