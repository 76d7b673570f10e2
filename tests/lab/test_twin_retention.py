"""KV retention in the twin (issue 32): the engine twin's retention runs on the virtual
clock, the router's hint reaches it, a returning program keeps its prefix where vLLM's LRU
alone loses it; the arms of a retention replay (per-spec engine settings, Continuum's
TTL-only rule) and their report."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from kernels_bench.lab.commands.replay import build_parser, replay_options  # noqa: E402
from kernels_bench.lab.replay.spec import SpecError, parse_policy  # noqa: E402
from kernels_bench.lab.twin import retention as report  # noqa: E402
from kernels_bench.lab.twin.engine_spec import engine_specs  # noqa: E402
from kernels_bench.lab.twin.request import TwinRequest  # noqa: E402
from kernels_bench.lab.twin.router import RouterCosts  # noqa: E402
from kernels_bench.lab.twin.run import TwinOptions, load_profiles, twin  # noqa: E402
from kernels_bench.lab.twin.sim import Simulator  # noqa: E402
from kernels_bench.lab.twin.step_time import StepTimeModel, load_profile  # noqa: E402
from kernels_bench.lib.cluster import ClusterError, engine_variant  # noqa: E402
from router.config.cluster import load_cluster_config  # noqa: E402
from router.policies import POLICIES  # noqa: E402
from scheduler_patches.contract import RetentionHint  # noqa: E402
from scheduler_patches.protected import ProtectedPrograms, RetentionSettings  # noqa: E402
from tests.lab.twin_helpers import (REPLAY_TOML, flat_spec, replay_cluster,  # noqa: E402
                                    write_replay_profiles)
from tests.replay_fixture import tiny_trace  # noqa: E402

BLOCK = 16


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_replay_profiles(tmp_path_factory.mktemp("profiles"))


def engine(profiles: Path, num_blocks: int, **settings: Any) -> Simulator:
    """One FCFS engine twin of ``num_blocks`` 16-token blocks with retention ``settings``."""
    sim = Simulator()
    spec = dataclasses.replace(flat_spec("e-0", "fcfs", num_blocks=num_blocks),
                               settings=settings)
    sim.add_engine(spec, StepTimeModel(load_profile(profiles / "tiny-a.json")))
    return sim


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 31) % 997 + 3 for i in range(n))


def returning(profiles: Path, **settings: Any) -> int:
    """Program p's first call (10 blocks), then, during its 5 s tool gap, four other
    calls of 10 blocks each on an engine of 40 blocks, then p's next call extends its
    first prompt: the prompt tokens it finds cached."""
    sim = engine(profiles, 40, **settings)
    prompt = tokens(1, 10 * BLOCK)
    hint = RetentionHint("p", False, 5.0)
    sim.submit("e-0", TwinRequest("p.0", prompt, 1, retention=hint), 0.0)
    for i in range(4):
        sim.submit("e-0", TwinRequest(f"o{i}", tokens(10 + i, 10 * BLOCK), 1), 1.0 + i)
    sim.submit("e-0", TwinRequest("p.1", prompt + tokens(2, 3 * BLOCK), 1,
                                  retention=RetentionHint("p", True)), 5.0)
    sim.run()
    return sim.engines["e-0"].records["p.1"].cached_tokens


def test_retention_keeps_a_returning_programs_prefix_where_lru_loses_it(
        profiles: Path) -> None:
    assert returning(profiles) == 10 * BLOCK
    assert returning(profiles, retention_ttl_only=True) == 10 * BLOCK
    assert returning(profiles, max_protected_programs=0) == 0  # vLLM's LRU alone
    assert returning(profiles, retention_ttl_s=0) == 0


def test_the_engine_twins_retention_runs_on_the_virtual_clock(profiles: Path) -> None:
    sim = engine(profiles, 100)
    twin = sim.engines["e-0"]
    retention = twin.scheduler.retention
    assert retention.clock == sim.now
    sim.submit("e-0", TwinRequest("a", tokens(1, 4 * BLOCK), 1,
                                  retention=RetentionHint("p", False, 1.0)), 0.0)
    sim.run()
    assert "p" in retention  # protected until min(30, 2 x 1 s) after its end, virtual
    sim.submit("e-0", TwinRequest("b", tokens(2, BLOCK), 1), 1.5)
    sim.run()
    assert "p" in retention
    sim.submit("e-0", TwinRequest("c", tokens(3, BLOCK), 1), 10.0)
    sim.run()
    assert "p" not in retention and retention.released["expired"] == 1


def test_the_twin_router_hands_the_engine_its_retention_hint(profiles: Path) -> None:
    sim, loop, router = replay_cluster(profiles, "round_robin")
    body = {"model": "auto", "messages": [{"role": "user", "content": "hello " * 300}],
            "max_tokens": 2, "ignore_eos": True, "stream": True,
            "workflow": {"program_id": "w0.1", "stage_index": 0, "num_stages": 2,
                         "final": False, "expected_return_s": 4.0}}
    try:
        loop.run_until_complete(router.start())
        res = loop.run_until_complete(router.send(body))
        loop.run_until_complete(router.stop())
    finally:
        loop.close()
    assert res.error is None and res.cached_tokens == 0
    retention = sim.engines[res.engine].scheduler.retention
    assert "w0.1" in retention
    assert retention.programs["w0.1"].next_use == pytest.approx(res.end_s + 4.0)


class Pool:
    def touch(self, blocks: Any) -> None:
        pass

    def free_blocks(self, blocks: Any) -> None:
        list(blocks)


def test_ttl_only_ignores_the_expected_return() -> None:
    """Continuum's rule: the TTL whatever the hint says, and with one place left the
    program that ended first keeps it; hetserve's keeps the one expected back first."""
    def protect(ttl_only: bool) -> ProtectedPrograms:
        now = [0.0]
        table = ProtectedPrograms(RetentionSettings(max_protected_programs=1,
                                                    retention_ttl_only=ttl_only),
                                  Pool(), 100, clock=lambda: now[0])
        table.protect("late", [1], 20.0)
        now[0] = 1.0
        table.protect("soon", [2], 2.0)
        return table

    hetserve, ttl = protect(False), protect(True)
    assert list(hetserve.programs) == ["soon"] and hetserve.programs["soon"].deadline == 5.0
    assert list(ttl.programs) == ["late"] and ttl.programs["late"].deadline == 30.0
    assert RetentionSettings(retention_ttl_only=True).ttl_s(2.0) == 30.0


def test_a_spec_sets_the_engines_retention(tmp_path: Path) -> None:
    scheds = ["stjf", "fcfs", "vllm-fcfs"]
    spec = parse_policy("chimera:stjf@tau=1.0,max_protected_programs=0", POLICIES, scheds)
    assert spec.overrides == (("tau", 1.0),)
    assert spec.engine_overrides == (("max_protected_programs", 0),)
    cfg = load_cluster_config(REPLAY_TOML)
    engines = engine_variant(cfg, spec.sched, spec.engine_overrides)
    assert [e.max_protected_programs for e in engines] == [0, 0]
    specs = engine_specs(dataclasses.replace(cfg, engines=engines))
    assert all(s.settings["max_protected_programs"] == 0 for s in specs)
    with pytest.raises(ValueError, match="max_protected_fraction"):
        engine_variant(cfg, None, (("max_protected_fraction", 2.0),))
    with pytest.raises(SpecError, match="no KV retention"):
        parse_policy("vllm:vllm-fcfs@retention_ttl_only=true", POLICIES, scheds)
    admit = parse_policy("chimera:stjf@admit_returning_first=true", POLICIES, scheds)
    assert admit.engine_overrides == (("admit_returning_first", True),)
    assert all(e.admit_returning_first for e in engine_variant(cfg, "stjf",
                                                               admit.engine_overrides))
    with pytest.raises(SpecError, match="admit_returning_first"):
        parse_policy("chimera:fcfs@admit_returning_first=true", POLICIES, scheds)
    with pytest.raises(ClusterError, match="admit_returning_first"):
        engine_variant(cfg, "mlfq", (("admit_returning_first", True),))


def test_a_retention_replay_in_the_twin_and_its_report(profiles: Path,
                                                       tmp_path: Path) -> None:
    """Four arms on one workload (tool gaps, chat context): records carry cached tokens
    and gaps, the arms run on their own engines, the report compares them paired and
    shows what each arm's retention and admission did."""
    trace = tiny_trace(tmp_path)
    out = tmp_path / "out"
    lru = "chimera-static:stjf@max_protected_programs=0"
    admit = "chimera-static:stjf@admit_returning_first=true"
    arms = ["chimera-static:stjf", "chimera-static:stjf@retention_ttl_only=true", admit, lru]
    a = build_parser(live=False).parse_args([
        "--cluster", str(REPLAY_TOML), "--trace", "t", "--model-map",
        "tiny-a=small,tiny-b=large", "--workflows", "8", "--priors-from-trace",
        "--rates", "2", "--tool-gap", "fixed:0.5", "--context", "chat", "--baseline", lru,
        "--out", str(out), "--policies", *arms])
    cfg = load_cluster_config(REPLAY_TOML)  # 16-token blocks: the short prompts fill some
    cfg = dataclasses.replace(cfg, engines=[dataclasses.replace(
        e, extra_args=[*e.extra_args, "--block-size", "16"]) for e in cfg.engines])
    summary = twin(cfg, trace, "tiny", replay_options(a, out),
                   TwinOptions(load_profiles(profiles, ["tiny-a", "tiny-b"]),
                               RouterCosts(charge_decision=False)), "test")
    assert summary["meta"]["tool_gap"] == "fixed:0.5" and summary["meta"]["context"] == "chat"
    assert all(set(r["block_sizes"].values()) == {16} for r in summary["runs"])
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert all(r["error"] is None and r["cached_tokens"] is not None for r in rows)
    gapped = [r for r in rows if r["stage_index"] < r["num_stages"] - 1]
    assert gapped and all(r["tool_gap_s"] == r["expected_return_s"] == 0.5 for r in gapped)
    later = [r for r in rows if r["stage_index"] > 0]
    assert later and all(r["cached_tokens"] > 0 for r in later)  # the chat prefix is hit
    res = report.analyse(out)
    assert res["baseline"] == lru and {c["policy"] for c in res["comparisons"]} == set(arms[:3])
    counted = {c["policy"]: c for c in res["counters"]}
    assert set(counted) == set(arms) and counted[lru]["released"] == {}
    assert "admitted_first" in counted[admit] and "calls admitted first" in report.tables(res)
    assert all(c["hit.1"] is not None for c in res["comparisons"])
    assert "recomputed prompt tokens" in report.tables(res)
    report.plot([res], tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_the_reports_token_counts_on_hand_made_calls() -> None:
    def call(stage: int, prompt: int, cached: int, attempt: int = 1) -> dict[str, Any]:
        return {"attempt": attempt, "stage_index": stage, "prompt_tokens": prompt,
                "cached_tokens": cached, "send_s": 0.0, "first_token_s": 0.1}

    calls = [call(0, 100, 0), call(1, 300, 64), call(2, 350, 300)]
    # stage 1: 96 of the previous 100 prompt tokens are in full blocks, 64 hit -> 32;
    # stage 2: 288 in full blocks, 300 hit -> 0
    assert report.recomputed_prefix(calls, 16) == 32.0
    assert report.recomputed(calls) == 236.0 + 50.0
    assert report.recomputed_prefix([*calls, call(1, 300, 0, attempt=2)], 16) == 32.0
    assert report.recomputed([call(0, 100, 0), {**call(1, 50, 0), "cached_tokens": None}]) is None
    # stage 1 moved to engine b: its 32 recomputed tokens follow the move
    on = [{**c, "engine": e} for c, e in zip(calls, ("a", "b", "b"))]
    assert report.moved_calls(on) == 1.0
    assert report.recomputed_prefix(on, 16, moved=False) == 0.0
    assert report.recomputed_prefix(on, 16, moved=True) == 32.0


def _hand_made_replay(folder: Path, seed: int, saved: float, gap: str = "exp:8") -> Path:
    """A chat-context replay of two specs (``lru``, ``keep``) at one rate, 20 two-stage
    workflows: the second call finds 0 (lru) or ``saved`` (keep) of the first call's 64
    prompt tokens cached."""
    folder.mkdir(parents=True)
    requests, flows = [], []
    for policy, cached in (("lru", 0), ("keep", saved)):
        for j in range(20):
            job = f"w{j:04d}"
            for stage, (prompt, hit) in enumerate(((64, 0), (96, int(cached)))):
                requests.append({"policy": policy, "rate": 1.0, "repeat": 0, "job_id": job,
                                 "attempt": 1, "stage_index": stage, "prompt_tokens": prompt,
                                 "cached_tokens": hit, "send_s": 0.0, "first_token_s": 0.01,
                                 "tool_gap_s": 1.0 if stage == 0 else None})
            flows.append({"policy": policy, "rate": 1.0, "repeat": 0, "job_id": job,
                          "num_stages": 2, "arrival_s": 0.0, "end_s": 2.0 + j / 100,
                          "error": None})
    for name, rows in (("requests", requests), ("workflows", flows)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = [{"policy": p, "rate": 1.0, "repeat": 0, "summary": {"twin": {"retention": {
        "released": {"returned": 3}, "refused": 1, "admitted_first": 2}}}}
        for p in ("lru", "keep")]
    (folder / "summary.json").write_text(json.dumps({"meta": {
        "baseline": "lru", "tool_gap": gap, "context": "chat", "seed": seed,
        "workflows": 20}, "runs": runs}))
    return folder


def test_the_report_pools_seeds_as_repeats(tmp_path: Path) -> None:
    """Folders of one setup at several seeds are one analysis: each seed a repeat, so a
    seed that disagrees widens the interval; counters are summed; folders of another
    setup, or the same seed twice, are refused."""
    a = _hand_made_replay(tmp_path / "s0", 0, saved=64)
    b = _hand_made_replay(tmp_path / "s1", 1, saved=0)
    one = report.analyse(a)
    pooled = report.analyse([a, b])
    assert one["seeds"] == [0] and pooled["seeds"] == [0, 1]
    cut = {r["policy"]: r for r in one["comparisons"]}["keep"]["recomputed_prefix"]
    assert cut["value"] == cut["high"] == 0.0  # seed 0 alone: every workflow saved all
    both = {r["policy"]: r for r in pooled["comparisons"]}["keep"]["recomputed_prefix"]
    assert both["value"] == pytest.approx(0.5)
    assert both["low"] == 0.0 and both["high"] == 1.0  # draws of seed 0 only, seed 1 only
    counted = {c["policy"]: c for c in pooled["counters"]}
    assert counted["keep"] == {"policy": "keep", "rate": 1.0, "released": {"returned": 6},
                               "refused": 2, "admitted_first": 4}
    assert "summed over engines and seeds" in report.tables(pooled)
    with pytest.raises(ValueError, match="tool_gap"):
        report.analyse([a, _hand_made_replay(tmp_path / "g2", 2, 64, gap="exp:2")])
    with pytest.raises(ValueError, match="same seed"):
        report.analyse([a, _hand_made_replay(tmp_path / "again", 0, 64)])
    report.main(["--pool", str(a), str(b), "--json", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text())[0]["seeds"] == [0, 1]


def test_the_report_reads_the_block_size_the_replay_recorded(tmp_path: Path) -> None:
    """The recomputed prefix counts full blocks of the engines' block size: the one each
    run recorded (``block_sizes``), else ``--block-size``, else 16; a recorded size that
    disagrees with ``--block-size`` or between engines is refused."""
    folder = _hand_made_replay(tmp_path / "r", 0, saved=0)

    def recomputed(res: dict[str, Any]) -> float:
        return {v["policy"]: v for v in res["values"]}["lru"]["recomputed_prefix"]["value"]

    assert recomputed(report.analyse(folder)) == 64.0  # 16-token blocks: all 64 tokens
    assert recomputed(report.analyse(folder, block_size=48)) == 48.0
    summary = json.loads((folder / "summary.json").read_text())
    for run in summary["runs"]:
        run["block_sizes"] = {"e-0": 48, "e-1": 48}
    (folder / "summary.json").write_text(json.dumps(summary))
    res = report.analyse(folder)
    assert res["block_size"] == 48 and recomputed(res) == 48.0
    with pytest.raises(ValueError, match="recorded its engines' block size as 48"):
        report.analyse(folder, block_size=16)
    summary["runs"][1]["block_sizes"] = {"e-0": 48, "e-1": 32}
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="different KV block sizes"):
        report.analyse(folder)
