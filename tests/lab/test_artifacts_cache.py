"""``kernels_bench artifacts``: trained once, kept while the rows, the split, the model map
and the settings are unchanged, retrained when any of them changes; served model names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels_bench.lab.commands import artifacts as artifacts_command
from kernels_bench.lab.replay import artifacts
from kernels_bench.predictors import profile
from kernels_bench.predictors.profile import ProfileOptions
from router.predictors.kinds import kind, split_rows
from router.predictors.records import Split
from router.predictors.sources import serve_as
from router.train import load_rows
from tests.replay_fixture import write_trace

MAP = ["a=small,b=large"]


def test_artifacts_are_cached_by_what_they_depend_on(tmp_path: Path) -> None:
    trace = str(write_trace(tmp_path / "t.jsonl", problems=8))
    out = tmp_path / "art"

    def build(sets: tuple[str, ...] = (), model_map: list[str] = MAP, holdout: float = 0.5,
              force: bool = False) -> str:
        return artifacts.build(["capability"], [trace], model_map, out, Split(0, holdout),
                               list(sets), force, progress=False)["capability"]

    assert build() == "trained"
    meta = json.loads((out / "capability" / "metadata.json").read_text())
    assert meta["models"] == ["a", "b"] and meta["data"]["model_map"] == {"a": "small",
                                                                           "b": "large"}
    assert build() == "up to date"
    assert build(force=True) == "trained"
    assert build(("capability.c=2.0",)) == "trained"           # settings
    assert build(("capability.c=2.0",), holdout=0.4) == "trained"  # split
    assert build(("capability.c=2.0",), ["a=large,b=small"], 0.4) == "trained"  # model map
    assert build(("capability.c=2.0",), ["a=large,b=small"], 0.4) == "up to date"
    (out / "capability" / "metadata.json").write_text("{}")   # unreadable: retrained
    assert build(("capability.c=2.0",), ["a=large,b=small"], 0.4) == "trained"


def test_folds_cross_fit_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    trace = str(write_trace(tmp_path / "t.jsonl", problems=8))
    out = tmp_path / "art"
    argv = ["--predictors", "capability", "--data", trace, "--model-map", MAP[0],
            "--out", str(out), "--folds", "3", "--quiet"]
    artifacts_command.main(argv)
    assert "3 trained, 0 up to date" in capsys.readouterr().out
    splits = [Split.of(json.loads((artifacts.fold_dir(out, k) / "capability" /
                                   "metadata.json").read_text())["data"]) for k in range(3)]
    assert splits == [Split.fold(0, k, 3) for k in range(3)]
    rows = load_rows(kind("capability"), [trace], MAP)
    held = [{r.problem_id for r in split_rows(rows, s)[1]} for s in splits]
    assert sum(map(len, held)) == len({r.problem_id for r in rows})  # each problem once
    artifacts_command.main(argv)
    assert "0 trained, 3 up to date" in capsys.readouterr().out
    for bad in (["--folds", "1"], ["--folds", "3", "--holdout", "0.2"]):
        with pytest.raises(SystemExit):
            artifacts_command.main([*argv[:-3], *bad])


def test_served_names_and_errors(tmp_path: Path) -> None:
    trace = str(write_trace(tmp_path / "t.jsonl", problems=2))
    rows = load_rows(kind("length"), [trace], MAP)
    assert {r.model for r in rows} == {"a", "b"} and all(r.run_id.endswith(f"|{r.model}")
                                                         for r in rows)
    with pytest.raises(ValueError, match="no record of ghost"):
        serve_as(rows, {"x": "ghost"})
    with pytest.raises(ValueError, match="the same trace model"):
        serve_as(load_rows(kind("length"), [trace]), {"a": "small", "b": "small"})
    with pytest.raises(ValueError, match="expected SERVED=TRACE_MODEL"):
        load_rows(kind("length"), [trace], ["a"])
    with pytest.raises(SystemExit):
        artifacts_command.main(["--holdout", "0", "--out", str(tmp_path / "x")])


def test_tpot_heads_follow_their_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    """A completed profile (its key file matches the cluster file and the machine) is kept;
    the heads are retrained when the profile's telemetry or their settings change. The
    profile itself, on real engines: tests/integration/test_profile.py."""
    import gzip

    import msgspec

    from router.predictors.synthetic import synthetic_telemetry

    cluster, out = tmp_path / "c.toml", tmp_path / "art"
    engines = ('[[engines]]\nname = "tiny-a"\nmodel = "builtin:tiny-a"\n'
               'max_num_seqs = 2\n')
    cluster.write_text('[router]\npolicy = "round_robin"\n' + engines)
    prof = out / "profile"
    prof.mkdir(parents=True)

    def write_profile(frames: int, done: bool = True) -> None:
        with gzip.open(prof / "telemetry.jsonl.gz", "wb") as f:
            for snap in synthetic_telemetry(frames):
                f.write(msgspec.json.encode(snap) + b"\n")
        if done:
            (prof / profile.PROFILE_KEY_FILE).write_text(
                profile.profile_key(cluster, profile.machine()))

    def fail(*args: object) -> None:
        raise AssertionError(f"profiled again: {args}")

    monkeypatch.setattr(profile, "profile_cluster", fail)
    write_profile(300)
    assert artifacts.build_tpot(cluster, out, [], progress=False) == {
        "profile": "up to date", "tpot": "trained"}
    assert json.loads((out / "tpot" / "metadata.json").read_text())["kind"] == "tpot"
    assert artifacts.build_tpot(cluster, out, [], progress=False)["tpot"] == "up to date"
    assert artifacts.build_tpot(cluster, out, ["tpot.max_depth=3"],
                                progress=False)["tpot"] == "trained"
    write_profile(320)  # a new profile: new telemetry
    assert artifacts.build_tpot(cluster, out, ["tpot.max_depth=3"],
                                progress=False)["tpot"] == "trained"

    key = profile.profile_key(cluster, profile.machine())
    assert profile.profile_key(cluster, {**profile.machine(), "cores": 999}) != key
    cluster.write_text('[router]\npolicy = "random"\n' + engines)  # the router: no matter
    assert profile.profile_key(cluster, profile.machine()) == key
    cluster.write_text('[router]\npolicy = "random"\n' + engines.replace("2", "4"))
    assert profile.profile_key(cluster, profile.machine()) != key
    with pytest.raises(AssertionError, match="profiled again"):  # the engines changed
        artifacts.build_tpot(cluster, out, [], progress=False)
    assert not (prof / profile.PROFILE_KEY_FILE).exists()  # never taken as complete
    monkeypatch.setattr(profile, "profile_cluster",  # a profile that completes
                        lambda *args: write_profile(340, done=False))
    assert artifacts.build_tpot(cluster, out, [], progress=False) == {
        "profile": "profiled", "tpot": "trained"}
    assert (prof / profile.PROFILE_KEY_FILE).read_text() == profile.profile_key(
        cluster, profile.machine())
    assert artifacts.build_tpot(cluster, out, [], progress=False)["profile"] == "up to date"
    monkeypatch.setattr(profile, "profile_cluster", fail)  # `kernels_bench profile` cut
    with pytest.raises(AssertionError, match="profiled again"):  # short over a done one
        profile.run_profile(cluster, [], ProfileOptions(out=prof))
    assert not (prof / profile.PROFILE_KEY_FILE).exists()
    monkeypatch.setattr(profile, "profile_cluster", lambda *args: None)
    profile.run_profile(cluster, ["tiny-a"], ProfileOptions(out=prof))  # named engines:
    assert not (prof / profile.PROFILE_KEY_FILE).exists()  # not the whole cluster
    with pytest.raises(ValueError, match="no-such.toml"):
        artifacts.build_tpot(tmp_path / "no-such.toml", out, [], progress=False)
