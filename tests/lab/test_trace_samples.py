"""Sampled runs in traces: the format (key, seed, grouping, P(correct)), the builder's
seeds and resumption checks, the datasheet's sampling section, and that the shipped
traces (no samples) read and describe exactly as before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec
import pytest

from kernels_bench.lab.trace.build import SAMPLING, Settings, open_trace
from kernels_bench.lab.trace.datasheet import summarize
from kernels_bench.lab.trace.workflows import WORKFLOWS
from router.trace_format import (
    FORMAT,
    VERSION,
    Header,
    Message,
    Stage,
    TraceFormatError,
    TraceWriter,
    Unit,
    encode,
    load_trace,
    read_records,
    sample_seed,
    stage_seed,
    unit_key,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT / "data/traces/math.jsonl.gz", ROOT / "data/traces/code.jsonl.gz"]
SOLVE = {"solve": ["solver"]}


def _header(settings: dict | None = None) -> Header:
    return Header(format=FORMAT, version=VERSION, suite="math", workflows=SOLVE,
                  settings=settings or {"seed": 0}, sources=[{"name": "x"}],
                  command="python -m kernels_bench trace build --cluster c.toml --suite math "
                          "--problems 1 --out t.jsonl.gz --samples 3")


def _unit(pid: str, model: str, correct: bool, sample: int | None = None,
          score: float | None = None) -> Unit:
    stage = Stage(index=0, role="solver", messages=[Message("user", pid)], prompt_tokens=3,
                  output_tokens=4, output_text="x", finish_reason="stop", latency_s=0.1)
    seed = None if sample is None else sample_seed(0, pid, "solve", model, sample)
    return Unit(key=unit_key(pid, "solve", model, sample), problem_id=pid, workflow="solve",
                model=model, user_prompt=pid, reference="1", stages=[stage], final_answer="1",
                correct=correct, score=float(correct) if score is None else score,
                total_output_tokens=4, latency_s=0.1, detail="extracted by boxed",
                sample=sample, seed=seed)


def _write(path: Path, records: list) -> Path:
    with TraceWriter(path) as w:
        for r in records:
            w.append(r)
    return path


def test_a_greedy_unit_encodes_as_before_and_a_sampled_one_carries_index_and_seed() -> None:
    greedy = json.loads(encode(_unit("p0", "m", True)))
    assert "sample" not in greedy and "seed" not in greedy and greedy["key"] == "p0|solve|m"
    sampled = json.loads(encode(_unit("p0", "m", True, sample=2)))
    assert sampled["key"] == "p0|solve|m|2" and sampled["sample"] == 2
    assert sampled["seed"] == sample_seed(0, "p0", "solve", "m", 2)


def test_samples_group_beside_the_greedy_run_in_index_order(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl.gz", [
        _header(), _unit("p0", "m", False), _unit("p0", "m", True, sample=1, score=0.5),
        _unit("p0", "m", False, sample=0, score=0.0), _unit("p0", "m", True, sample=2),
        _unit("p0", "n", True), _unit("p1", "m", True, sample=0)])
    t = load_trace(path)
    assert t.has_samples and t.models == ["m", "n"]
    run = t.runs[0]
    assert run.models["m"].sample is None and not run.models["m"].correct
    assert [r.sample for r in run.samples["m"]] == [0, 1, 2]
    assert run.p_correct("m") == pytest.approx(2 / 3)
    assert run.expected_score("m") == pytest.approx(0.5)
    assert run.outcomes("n") == [run.models["n"]] and run.p_correct("n") == 1.0
    # a problem with samples but no greedy run yet (a build in progress): not complete
    assert [(r.problem_id, list(r.models)) for r in t.complete_runs(["m"])] == [("p0", ["m",
                                                                                         "n"])]
    assert t.runs[1].p_correct("m") == 1.0


@pytest.mark.parametrize("change, message", [
    ({"key": "p0|solve|m"}, "is not problem_id|workflow|model|sample"),
    ({"seed": None}, "`seed` is set exactly when `sample` is"),
    ({"sample": -1, "key": "p0|solve|m|-1"}, r"Expected `int` >= 0 - at `\$.sample`"),
])
def test_a_bad_sampled_unit_is_refused(tmp_path: Path, change: dict, message: str) -> None:
    u = msgspec.to_builtins(_unit("p0", "m", True, sample=0)) | change
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(msgspec.to_builtins(_header())) + "\n" + json.dumps(u) + "\n")
    with pytest.raises(TraceFormatError, match=message):
        load_trace(path)


def test_sample_seeds_are_distinct_per_run_and_the_same_in_every_process() -> None:
    seeds = {sample_seed(s, p, w, m, k) for s in (0, 1) for p in ("a", "b")
             for w in ("solve", "plan_solve") for m in ("m1", "m2") for k in range(4)}
    assert len(seeds) == 2 * 2 * 2 * 2 * 4
    assert all(0 <= x < 2**31 for x in seeds)
    digest = hashlib.sha256(b"0|gsm_symbolic/0/3|solve|m|1").digest()  # docs/research/traces.md
    assert sample_seed(0, "gsm_symbolic/0/3", "solve", "m", 1) == \
        int.from_bytes(digest[:4], "big") % 2**31
    assert stage_seed(2**31 - 1, 2) == 1


def _build_header(samples: int, temperature: float = 0.7) -> Header:
    s = Settings("math", 10, 0, 512, 8, 10.0, samples, temperature, 0.95)
    return Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS["math"],
                  settings=s.header_settings(), sources=[], command="x")


def test_greedy_settings_are_unchanged_and_sampling_is_added_once(tmp_path: Path) -> None:
    assert set(_build_header(0).settings) == {"seed", "max_tokens", "temperature",
                                             "prompt_version", "code_timeout_s"}
    out = tmp_path / "t.jsonl.gz"
    open_trace(out, _build_header(0))
    with TraceWriter(out) as w:
        w.append(_unit("p", "m", True))
    assert open_trace(out, _build_header(2)) == {"p|solve|m"}  # samples added to a file
    header, units = read_records(out)
    assert header.settings[SAMPLING] == {"temperature": 0.7, "top_p": 0.95}
    assert header.settings["temperature"] == 0.0 and len(units) == 1
    before = out.read_bytes()
    assert open_trace(out, _build_header(4)) == {"p|solve|m"}  # more samples: same settings
    assert open_trace(out, _build_header(0)) == {"p|solve|m"}  # a greedy-only resume
    assert out.read_bytes() == before
    with pytest.raises(SystemExit, match="samples were drawn with different settings"):
        open_trace(out, _build_header(2, temperature=1.0))


def test_datasheet_reports_samples_per_unit_and_p_correct(tmp_path: Path) -> None:
    settings = {"seed": 0, "max_tokens": 512, "code_timeout_s": 10.0,
                SAMPLING: {"temperature": 0.7, "top_p": 0.95}}
    p0, p1 = "gsm_symbolic/0/0", "gsm_symbolic/0/1"  # the suite's first two: a rebuild command
    path = _write(tmp_path / "t.jsonl.gz", [
        _header(settings), _unit(p0, "m", True), _unit(p1, "m", False),
        _unit(p0, "m", True, sample=0), _unit(p0, "m", False, sample=1),
        _unit(p1, "m", False, sample=0), _unit(p1, "m", False, sample=1),
        _unit(p1, "m", True, sample=2)])
    s = summarize(load_trace(path), path)
    sm = s["samples"]["m"]
    assert (sm["runs"], sm["units"], sm["disagreeing_units"]) == (5, 2, 2)
    assert (sm["per_unit"]["min"], sm["per_unit"]["max"]) == (2.0, 3.0)
    assert sm["p_correct"]["solve"] == {"n": 2, "accuracy": pytest.approx((1 / 2 + 1 / 3) / 2)}
    assert s["accuracy"]["m"]["solve"] == {"n": 2, "accuracy": 0.5}  # greedy, as before
    assert s["rebuild"].endswith(f"--seed 0 --max-tokens 512 --code-timeout 10.0 --samples 3 "
                                 f"--temperature 0.7 --top-p 0.95 --models m --suite math "
                                 f"--problems 2 --out {path.as_posix()}")
    from kernels_bench.lab.trace.datasheet import render

    text = render([s], "t", "x")
    assert "**P(correct) with sampling**" in text
    assert "| m | 41.7% (2) | 41.7% (2) |" in text


def test_shipped_traces_have_no_samples_and_describe_as_their_datasheet_says() -> None:
    traces = [load_trace(p) for p in SHIPPED]
    assert not any(t.has_samples for t in traces)
    shipped = json.loads((ROOT / "data/traces/DATASHEET.json").read_text())
    now = json.loads(json.dumps([summarize(t, p.relative_to(ROOT))
                                 for t, p in zip(traces, SHIPPED)]))
    assert now == shipped
    for t in traces:
        for run in t.runs:
            for m, mr in run.models.items():
                assert run.p_correct(m) == float(mr.correct)
                assert run.expected_score(m) == mr.score


def test_seeded_sampling_engines_prefill_unchunked(tmp_path: Path) -> None:
    from kernels_bench.lab.trace.engines import UNCHUNKED, unchunked
    from launcher.settings import load_launch_config

    engine = ('[[engines]]\nname = "{name}"\nmodel = "builtin:tiny-a"\ndtype = "float32"\n'
              'max_num_seqs = 4\n')
    (tmp_path / "c.toml").write_text(
        '[router]\npolicy = "round_robin"\n\n' + engine.format(name="a")
        + "max_model_len = 2048\n\n" + engine.format(name="b"))
    cfg = load_launch_config(tmp_path / "c.toml")
    a = unchunked(cfg, "a").engine("a")
    assert a.extra_args == [UNCHUNKED] and a.max_num_batched_tokens == 2048
    assert unchunked(unchunked(cfg, "a"), "a").engine("a") == a  # once
    assert unchunked(cfg, "a").engine("b") == cfg.engine("b")
    with pytest.raises(SystemExit, match="needs `max_model_len` set"):
        unchunked(cfg, "b")
