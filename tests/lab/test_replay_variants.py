"""Cluster config variants of a replay: engine scheduler, router policy, run order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kernels_bench.lab.replay.run import (check_variant, drift_warning, grouped, router_variant,
                                          schedule, spec_inputs)
from kernels_bench.lab.replay.spec import parse_policies
from kernels_bench.lib.cluster import ClusterError, engine_variant
from router.config.cluster import ClusterConfig, load_cluster_config
from router.config.engines import SCHED_POLICIES
from router.policies import POLICIES
from router.predictors.records import Split

ROOT = Path(__file__).resolve().parents[2]
PRIORS = {"accuracy": {"tiny-a": 0.3, "tiny-b": 0.6},
          "mean_output_tokens": {"tiny-a": 200.0, "tiny-b": 250.0}}


@pytest.fixture
def cfg() -> ClusterConfig:
    return load_cluster_config(ROOT / "examples" / "replay.toml")


def specs(*labels: str) -> list:  # type: ignore[type-arg]
    return parse_policies(labels, POLICIES, SCHED_POLICIES)


def test_engine_variant_sets_the_scheduler_and_dev_mode(cfg: ClusterConfig) -> None:
    fcfs = engine_variant(cfg, "fcfs")
    assert [e.sched_policy for e in fcfs] == ["fcfs", "fcfs"]
    assert all(e.env["VLLM_SERVER_DEV_MODE"] == "1" for e in fcfs)
    assert [e.sched_policy for e in engine_variant(cfg, None)] == ["stjf", "stjf"]


def test_engine_variant_makes_stock_vllm_engines(cfg: ClusterConfig) -> None:
    stock = engine_variant(cfg, "vllm-priority")
    assert [(e.kind, e.sched_policy, e.priority_wire) for e in stock] == \
        [("vllm", "priority", "stock")] * 2
    assert all(e.env["VLLM_SERVER_DEV_MODE"] == "1" for e in stock)
    fcfs = engine_variant(cfg, "vllm-fcfs")
    assert [(e.kind, e.priority_wire) for e in fcfs] == [("vllm", "none")] * 2
    assert [e.label for e in parse_policies(["chimera:vllm-priority"], POLICIES,
                                            [*SCHED_POLICIES, "vllm-priority"])] == \
        ["chimera:vllm-priority"]


def test_engine_variant_refuses_to_set_a_remote_scheduler(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(
        '[router]\npolicy = "vllm"\ninsecure = true\n[[engines]]\nname = "far-0"\nurl = "http://10.0.0.7:8101"\n'
        'telemetry_endpoint = "tcp://10.0.0.2:5601"\nkv_events_endpoint = "tcp://10.0.0.2:5602"\n')
    cfg = load_cluster_config(tmp_path / "c.toml")
    assert engine_variant(cfg, None) == cfg.engines
    with pytest.raises(ClusterError, match="far-0 is remote"):
        engine_variant(cfg, "fcfs")


def test_router_variant(cfg: ClusterConfig) -> None:
    oracle, lm = specs("oracle-static", "lmetric")
    r = router_variant(cfg, oracle, PRIORS)
    assert r.policy == "chimera" and r.allow_client_priority
    assert r.policies["chimera"]["confidence"] == {"tiny-a": 0.3, "tiny-b": 0.6}
    assert r.heartbeat_timeout_s == cfg.router.heartbeat_timeout_s  # the file's other keys
    r = router_variant(cfg, lm, None)
    assert r.policy == "lmetric" and not r.allow_client_priority
    assert "confidence" not in r.policies["chimera"]
    check_variant(cfg, router_variant(cfg, oracle, PRIORS), oracle)
    with pytest.raises(ValueError, match="policy 'oracle-static'.*--priors-from-trace"):
        check_variant(cfg, router_variant(cfg, oracle, None), oracle)


def test_a_spec_may_set_another_policys_table(cfg: ClusterConfig) -> None:
    spec, = specs("chimera:stjf@lmetric.count_arriving=true,tau=0.5")
    r = router_variant(cfg, spec, None)
    assert r.policies["lmetric"]["count_arriving"] is True
    assert r.policies["chimera"]["tau"] == 0.5 and "count_arriving" not in r.policies["chimera"]
    assert router_variant(cfg, *specs("chimera"), None).policies.get("lmetric", {}).get(
        "count_arriving") is None


ARTIFACTS = {"semantic_router": "/a/sr", "length": "/a/len", "knn": "/a/knn",
             "capability": "/a/cap"}


def test_artifacts_go_to_the_policies_that_route_on_them(cfg: ClusterConfig) -> None:
    chimera, static, laar, vllm = specs("chimera:stjf", "chimera-static:fcfs", "laar",
                                        "vllm:fcfs")
    r = router_variant(cfg, chimera, PRIORS, ARTIFACTS)
    assert r.predictors == {"semantic_router": "/a/sr", "length": "/a/len"}
    assert spec_inputs(r) == {"predictors": ["length", "semantic_router"],
                              "static_prior": True}  # the file's decode profile tables
    r = router_variant(cfg, static, PRIORS, ARTIFACTS)
    assert r.predictors == {} and r.policies["chimera"]["static_prior"] is True
    assert r.policies["chimera"]["confidence"] == PRIORS["accuracy"]
    knn = specs('chimera:stjf@quality="knn"')[0]  # the KNN in the semantic router's place
    r = router_variant(cfg, knn, PRIORS, ARTIFACTS)
    assert r.predictors == {"knn": "/a/knn", "length": "/a/len"}
    assert spec_inputs(r)["predictors"] == ["knn", "length"]
    assert router_variant(cfg, laar, None, ARTIFACTS).predictors == {"capability": "/a/cap"}
    assert router_variant(cfg, vllm, None, ARTIFACTS).predictors == {}


def test_a_spec_name_never_misstates_its_inputs(cfg: ClusterConfig) -> None:
    chimera, oracle, vllm_static = specs("chimera:stjf", "oracle", "vllm-static:fcfs")
    for spec, fix in ((chimera, "'chimera-static:stjf'"), (oracle, "'oracle-static'")):
        with pytest.raises(ValueError, match=f"none is given: pass --artifacts.*{fix}"):
            check_variant(cfg, router_variant(cfg, spec, PRIORS), spec)
    with pytest.raises(ValueError, match="routes on no trained predictor; drop '-static'"):
        check_variant(cfg, router_variant(cfg, vllm_static, None), vllm_static)
    assert chimera.static is False and specs("chimera-static")[0].static is True


def test_runs_grouped_by_engine_settings(cfg: ClusterConfig) -> None:
    given = specs("chimera:stjf", "vllm:fcfs", "lmetric", "chimera:fcfs", "oracle")
    got = grouped(given, lambda s: engine_variant(cfg, s.sched))
    assert [[s.label for s in g] for g in got] == [["chimera:stjf", "lmetric", "oracle"],
                                                   ["vllm:fcfs", "chimera:fcfs"]]


def test_a_live_comparison_across_engine_groups_with_few_repeats_is_warned(
        cfg: ClusterConfig) -> None:
    two = grouped(specs("chimera:stjf", "vllm:fcfs"), lambda s: engine_variant(cfg, s.sched))
    one = grouped(specs("chimera:stjf", "lmetric"), lambda s: engine_variant(cfg, s.sched))
    assert "2 engine groups (chimera:stjf | vllm:fcfs)" in (drift_warning(two, 2) or "")
    assert drift_warning(two, 3) is None and drift_warning(one, 1) is None


def test_repeats_are_interleaved_and_rotated(cfg: ClusterConfig) -> None:
    given = specs("chimera:stjf", "lmetric", "vllm:fcfs")
    plan = schedule(given, [1.0, 2.0], 3, lambda s: engine_variant(cfg, s.sched))
    assert len(plan) == 3 * 3 * 2
    order = [[s.spec.label for s in plan if s.repeat == rep and s.rate == 1.0]
             for rep in range(3)]
    assert order == [["chimera:stjf", "lmetric", "vllm:fcfs"],
                     ["vllm:fcfs", "lmetric", "chimera:stjf"],
                     ["chimera:stjf", "lmetric", "vllm:fcfs"]]
    # every repeat runs every (policy, rate) once, before the next repeat starts
    assert [s.repeat for s in plan] == sorted(s.repeat for s in plan)
    assert {s.fold for s in plan} == {0}


def test_folds_run_inside_each_engine_group_with_rotated_order(cfg: ClusterConfig) -> None:
    given = specs("chimera:stjf", "oracle", "vllm:fcfs")  # groups: stjf (2 specs), fcfs
    plan = schedule(given, [3.0], 2, lambda s: engine_variant(cfg, s.sched), folds=3)
    assert len(plan) == 2 * 3 * 3
    assert sorted((s.repeat, s.fold, s.spec.label) for s in plan) == sorted(
        (k, f, p.label) for k in range(2) for f in range(3) for p in given)
    first = [(s.fold, s.spec.label) for s in plan if s.repeat == 0]
    assert first == [(0, "chimera:stjf"), (0, "oracle"), (1, "oracle"), (1, "chimera:stjf"),
                     (2, "chimera:stjf"), (2, "oracle"),
                     (0, "vllm:fcfs"), (1, "vllm:fcfs"), (2, "vllm:fcfs")]
    # repeat 2 starts with the other engine group (one engine restart fewer than per fold)
    assert next(s.spec.label for s in plan if s.repeat == 1) == "vllm:fcfs"


def test_results_name_no_path_of_this_machine(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels_bench.lab.commands.replay import portable

    monkeypatch.chdir(tmp_path)
    assert portable(str(tmp_path / "runs" / "out")) == "runs/out"  # need not exist
    assert portable("/elsewhere/trace.jsonl.gz") == "trace.jsonl.gz"
    assert portable("chimera:stjf") == "chimera:stjf" and portable("3") == "3"


def test_trained_splits_come_from_the_artifacts(tmp_path: Path, cfg: ClusterConfig) -> None:
    import json

    from kernels_bench.lab.replay.run import trained_splits
    from router.predictors.artifact import ArtifactError

    for name, kind, seed in (("len", "length", 3), ("tp", "tpot", 4),
                             ("sr", "semantic_router", 3)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metadata.json").write_text(json.dumps(
            {"kind": kind, "data": {"seed": seed, "holdout": 0.2, "holdout_start": 0.4}}))
    router = dataclasses.replace(cfg.router, predictors={
        k: str(tmp_path / k) for k in ("len", "tp", "sr")})
    assert trained_splits([router, cfg.router]) == [Split(3, 0.2, 0.4)]
    (tmp_path / "len" / "metadata.json").write_text("{}")
    with pytest.raises(ArtifactError, match="train / held-out split"):
        trained_splits([router])


def test_spec_settings_reach_its_router_only(cfg: ClusterConfig) -> None:
    swept, plain = specs("chimera-static:stjf@tau=0.7", "chimera-static:stjf")
    assert router_variant(cfg, swept, PRIORS).policies["chimera"]["tau"] == 0.7
    assert router_variant(cfg, plain, PRIORS).policies["chimera"]["tau"] == \
        cfg.router.policies["chimera"]["tau"] != 0.7  # the file's
    bad = specs("chimera-static@tau=-1")[0]
    with pytest.raises(ValueError, match="router.policies.chimera.tau"):
        check_variant(cfg, router_variant(cfg, bad, PRIORS), bad)


def fake_artifacts(root: Path, splits: list[Split], kinds: tuple[str, ...] = (
        "semantic_router", "length")) -> None:
    """Artifact folders holding only the metadata the replay's planning reads."""
    import json

    for folder, split in zip([root / f"fold-{k}" for k in range(len(splits))], splits):
        for kind in kinds:
            (folder / kind).mkdir(parents=True)
            (folder / kind / "metadata.json").write_text(json.dumps(
                {"kind": kind, "data": split.info()}))


def test_artifact_layouts(tmp_path: Path) -> None:
    from kernels_bench.lab.commands.replay import artifact_folders

    fake_artifacts(tmp_path / "folds", [Split.fold(0, k, 3) for k in range(3)])
    folds = artifact_folders(tmp_path / "folds")
    assert [sorted(f) for f in folds] == [["length", "semantic_router"]] * 3
    assert folds[2]["length"].endswith("fold-2/length")
    one = artifact_folders(tmp_path / "folds" / "fold-1")
    assert len(one) == 1 and one[0]["length"].endswith("fold-1/length")
    (tmp_path / "folds" / "tpot").mkdir()  # telemetry-trained: shared by every fold
    (tmp_path / "folds" / "tpot" / "metadata.json").write_text("{}")
    folds = artifact_folders(tmp_path / "folds")
    assert [sorted(f) for f in folds] == [["length", "semantic_router", "tpot"]] * 3
    assert {f["tpot"] for f in folds} == {str((tmp_path / "folds" / "tpot").resolve())}
    (tmp_path / "folds" / "length").mkdir()
    (tmp_path / "folds" / "length" / "metadata.json").write_text("{}")
    with pytest.raises(ValueError, match="both predictor folders and fold-k"):
        artifact_folders(tmp_path / "folds")
    (tmp_path / "gap" / "fold-0").mkdir(parents=True)
    with pytest.raises(ValueError, match="no predictor artifact in fold-0"):
        artifact_folders(tmp_path / "gap")
    with pytest.raises(ValueError, match="no predictor artifact in it"):
        artifact_folders(tmp_path / "nothing")


def test_cross_fitted_plan_replays_each_fold_on_its_own_problems(tmp_path: Path,
                                                               cfg: ClusterConfig) -> None:
    from kernels_bench.lab.commands.replay import artifact_folders
    from kernels_bench.lab.replay.run import ReplayOptions, prepare
    from tests.replay_fixture import tiny_trace

    trace = tiny_trace(tmp_path, problems=12)
    splits = [Split.fold(0, k, 2) for k in range(2)]
    fake_artifacts(tmp_path / "art", splits)

    def options(artifacts: list[dict[str, str]], problems: str = "held-out",
                policies: tuple[str, ...] = ("chimera:stjf", "chimera-static:stjf", "vllm:fcfs")
                ) -> ReplayOptions:
        return ReplayOptions(
            policies=specs(*policies), rates=[2.0], arrival="poisson", cv=1.0, workflows=5,
            seed=0, model_map={"tiny-a": "small", "tiny-b": "large"}, max_attempts=1,
            run_attempts=1, priors_from_trace=True, baseline="vllm:fcfs", repeats=2,
            problems=problems, artifacts=artifacts, out=tmp_path / "out",
            run_dir=tmp_path / "run")

    p = prepare(cfg, trace, "t", options(artifact_folders(tmp_path / "art")), "cmd")
    assert len(p.folds) == 2 and len(p.plan) == 2 * 2 * 3
    assert p.summary["meta"]["folds"] == 2
    assert p.summary["meta"]["held_out_splits"] == [
        {"seed": 0, "fraction": 0.5, "start": 0.0}, {"seed": 0, "fraction": 0.5, "start": 0.5}]
    for split, fold in zip(splits, p.folds):
        assert fold.splits == [split]
        assert all(split.holds_out(j.run.problem_id) for j in fold.jobs[2.0])
        assert fold.routers["chimera:stjf"].predictors["length"].endswith(
            f"fold-{int(split.start * 2)}/length")
    ids = [[j.job_id for j in f.jobs[2.0]] for f in p.folds]
    assert ids == [[f"w{i:04d}" for i in range(5)], [f"w{i:04d}" for i in range(5, 10)]]
    # static priors of each fold average only the problems its predictors trained on
    assert p.folds[0].priors != p.folds[1].priors
    assert p.summary["meta"]["priors_from_trace"] == [f.priors for f in p.folds]  # all kept
    with pytest.raises(ValueError, match="cross-fitted artifacts replay held-out problems"):
        prepare(cfg, trace, "t", options(artifact_folders(tmp_path / "art"), "trained"), "cmd")
    with pytest.raises(ValueError, match="no policy routes on trained predictors"):
        prepare(cfg, trace, "t", options(artifact_folders(tmp_path / "art"),
                                         policies=("chimera-static:stjf", "vllm:fcfs")), "cmd")
    same = [artifact_folders(tmp_path / "art")[0]] * 2
    with pytest.raises(ValueError, match="two artifact folds have the same split"):
        prepare(cfg, trace, "t", options(same), "cmd")
