"""cluster.toml -> trained predictors -> policies: a cluster file whose [router.predictors]
names artifacts (trained here on small SYNTHETIC data) makes the router (its
``load_configured_predictors``) run chimera, laar and routebalance on those artifacts,
through the batched service, and nothing else."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kernels_bench.commands import router as router_command
from kernels_bench.overhead import router as router_bench
from router.app import load_configured_predictors
from router.config.cluster import ClusterConfig, load_cluster_config
from router.dispatch.core import RouterCore
from router.predictors.artifact import ArtifactError
from router.predictors.capability import CapabilityModel, CapabilitySettings
from router.predictors.features import from_record
from router.predictors.kinds import kind
from router.predictors.knn import KnnEstimator, KnnSettings
from router.predictors.length import LengthPredictor, LengthSettings
from router.predictors.loader import close_predictors, load_cluster_predictors
from router.predictors.semantic import SemanticRouter, SemanticSettings
from router.predictors.service import Served, ServiceSettings
from router.predictors.sources import load_tpot_samples
from router.predictors.table import prompt_table
from router.predictors.tpot import TpotHeads, TpotSettings
from tests.fixtures.predictors import request, split

MODELS = ["synthetic-large", "synthetic-small"]
INFO = {"seed": 0, "holdout": 0.2}
PROFILES = {m: {"decode_ms_per_token": 5.0, "max_batch_size": 8, "mean_output_tokens": 100.0}
            for m in MODELS}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every predictor trained on 8 problems per task (test-sized settings)."""
    root = tmp_path_factory.mktemp("cluster")
    train, _ = split(problems=8)
    first, every = prompt_table(train, MODELS, True), prompt_table(train, MODELS, False)
    SemanticRouter.train(first, SemanticSettings(max_length=32, epochs=1),
                         progress=False).save(root / "art" / "semantic_router", INFO)
    LengthPredictor.train(train, LengthSettings(n_estimators=10, svd_components=8),
                          progress=False).save(root / "art" / "length", INFO)
    KnnEstimator.train(every, KnnSettings(max_length=32), progress=False) \
        .save(root / "art" / "knn", INFO)
    CapabilityModel.train(first, CapabilitySettings()).save(root / "art" / "capability", INFO)
    TpotHeads.train(load_tpot_samples(["synthetic-telemetry:200"]), TpotSettings(),
                    progress=False).save(root / "art" / "tpot", INFO)
    (root / "art" / "profiles.json").write_text(json.dumps(PROFILES))
    return root


def cluster_file(root: Path, policy: str, extra_model: str | None = None) -> ClusterConfig:
    """A cluster file with relative artifact paths, as a user writes it."""
    engines = [(m, m) for m in MODELS] + ([("extra", extra_model)] if extra_model else [])
    text = [f'[router]\npolicy = "{policy}"\n',
            "[router.predictors]", *(f'{n} = "art/{n}"' for n in
                                     ("semantic_router", "length", "knn", "capability", "tpot")),
            'profiles = "art/profiles.json"\n',
            "[router.policies.routebalance]",
            "cost_per_token = { " + ", ".join(f'"{m}" = 0.0' for m, _ in engines) + " }\n"]
    for i, (name, served) in enumerate(engines):
        text += ["[[engines]]", f'name = "{name}"', 'model = "builtin:tiny-a"',
                 f'served_model_name = "{served}"', f"port = {18600 + i}",
                 f'telemetry_endpoint = "ipc://{root}/{name}.telemetry"',
                 f'kv_events_endpoint = "ipc://{root}/{name}.kv"\n']
    path = root / f"{policy}-{extra_model}.toml"
    path.write_text("\n".join(text))
    return load_cluster_config(path)


def direct(root: Path, name: str) -> Any:
    """The artifact loaded in this process, for comparison."""
    return kind(name).predictor.load(root / "art" / name)


def test_cluster_file_makes_policies_use_the_artifacts(artifacts: Path) -> None:
    _, test = split(problems=8)
    reqs = [request(r, str(i)) for i, r in enumerate(test[:12])]
    pset = load_configured_predictors(cluster_file(artifacts, "chimera"))
    assert pset is not None
    try:
        for name in ("semantic_router", "length", "knn", "capability"):
            # in the router process when its call was timed cheap enough, else the pool's
            pooled = pset.call_ms[name] > ServiceSettings().inline_max_ms
            assert isinstance(getattr(pset, name), Served) == pooled, name
        assert pset.tpot is not None and pset.tpot.engines == {f"{m}-0" for m in MODELS}
        assert pset.profiles["synthetic-small"].mean_output_tokens == 100.0

        cores = {p: RouterCore(cluster_file(artifacts, p), pset)
                 for p in ("chimera", "laar", "routebalance")}
        for p, core in cores.items():
            policy = core.build_policy()
            assert set(policy.sources.values()) == {"predictor"}, (p, policy.sources)

        async def predictions() -> dict[str, list[Any]]:
            return {p: list(await c.routing.policy.predict(reqs)) for p, c in cores.items()
                    if c.routing.policy is not None}

        got = asyncio.run(predictions())
        feats = [from_record(r) for r in test[:12]]
        q = direct(artifacts, "semantic_router").predict(feats)
        remaining = direct(artifacts, "length").predict(feats)
        for pred, want_q, want_n in zip(got["chimera"], q, remaining):
            assert pred.q == pytest.approx(want_q, abs=1e-5)
            assert pred.remaining == want_n
        assert got["laar"] == direct(artifacts, "capability").predict(feats)
        assert got["routebalance"] == direct(artifacts, "knn").predict(feats)
    finally:
        close_predictors(pset)


def test_a_model_the_artifacts_do_not_know_fails_at_start(artifacts: Path) -> None:
    with pytest.raises(ArtifactError, match="also has gpt-9; retrain it"):
        load_cluster_predictors(cluster_file(artifacts, "chimera", "gpt-9"), service=None)


def test_router_bench_routes_on_the_artifacts(artifacts: Path, tmp_path: Path) -> None:
    """``kernels_bench router --artifacts``: chimera and routebalance decide on the trained
    predictors (their sources say so), on engines serving the artifacts' models, with the
    fixture's prompts; the JSON records where each predictor ran."""
    data = str(Path(__file__).parents[1] / "fixtures" / "predictors" / "synthetic.jsonl.gz")
    pset, models, prompts = router_bench.learned(artifacts / "art", [data])
    try:
        assert models == ("synthetic-large", "synthetic-small")
        assert prompts and all(r.stage_index == 0 for r in prompts)
        cluster = router_bench.make_cluster(2, random.Random(0), models)
        cluster.predictors, cluster.prompts = pset, prompts
        for policy, source in (("chimera", "confidence"), ("routebalance", "quality_length")):
            core = router_bench.make_core(policy, cluster, 1)
            policy = core.routing.policy
            assert policy is not None and policy.sources[source] == "predictor"
    finally:
        close_predictors(pset)
    out = tmp_path / "bench"
    router_command.main(["--artifacts", str(artifacts / "art"), "--data", data, "--policies",
                       "chimera", "routebalance", "--engines", "2", "--batches", "1",
                       "--requests", "20", "--out", str(out)])
    result = json.loads((out / "router_bench.json").read_text())
    assert sorted(result["meta"]["predictor_call_ms"]) == ["knn", "length", "semantic_router"]
    assert {r["policy"] for r in result["rows"]} == {"round_robin", "chimera", "routebalance"}
