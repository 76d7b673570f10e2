"""Twin profiles from a measured floor (``kernels_bench.lab.twin.floor``) and the kernel benchmark
that measures one (``python -m kernels_bench kernels``).

Hand-made floor, shape ``tiny`` (the roofline test's hand-computed config): decode
(graph ms; eager larger, so a wrong pick shows) at contexts 100 and 300, batches 1 and 3:

    c = 100:  b = 1  2.0,  b = 3  4.0
    c = 300:  b = 1  3.0,  b = 3  7.0

prefill: 16 tokens 5.0 ms eager; 64 tokens 8.0 eager, 6.4 graph -> 6.4 / 64 = 0.1 ms per
token. With 0.5 ms of overhead: D(1, 100) = 2.5 and D(3, 300) = 7.5 (grid points, exact);
D(2, 100) = 3.5 (between batches), D(1, 200) = 3.0 (between contexts), D(2, 200) = (3.5 +
5.5) / 2 = 4.5 (both).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernels_bench.lab.twin import floor
from kernels_bench.lab.twin.roofline import decode_profile, floor_seconds, gpu_preset, model_shape
from kernels_bench.lab.twin.step_time import StepTimeModel, load_profile

ROOT = Path(__file__).parents[2]
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
        "vocab_size": 1000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096}
GRAPH = {(1, 100): 2.0, (3, 100): 4.0, (1, 300): 3.0, (3, 300): 7.0}


def hand_floor() -> dict[str, Any]:
    decode = [{"model": "tiny", "batch": b, "context": c, "eager_ms": 10 * ms, "graph_ms": ms}
              for (b, c), ms in GRAPH.items()]
    decode.append({"model": "other", "batch": 1, "context": 100, "eager_ms": 99.0,
                   "graph_ms": None})
    prefill = [{"model": "tiny", "prompt_tokens": 16, "ms": 5.0},
               {"model": "tiny", "prompt_tokens": 64, "ms": 8.0, "graph_ms": 6.4},
               {"model": "other", "prompt_tokens": 16, "ms": 1.0}]
    return {"device": "hand", "torch": "0", "decode": decode, "prefill": prefill}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A folder with TINY's config.json, named ``tiny`` (its shape name)."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    return tmp_path / "tiny"


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def profile_model(floor_path: Path, model: Path, overhead_ms: float) -> StepTimeModel:
    file = floor.floor_file(floor_path, str(model), "h200", "tiny", overhead_ms)
    out = write(floor_path.with_name("tiny-profile.json"), file)
    return StepTimeModel(load_profile(out))


def test_grid_points_exact_and_linear_between(tmp_path: Path, tiny: Path) -> None:
    m = profile_model(write(tmp_path / "floor.json", hand_floor()), tiny, 0.5)
    for (b, c), ms in GRAPH.items():
        assert m.decode_ms(b, c)[0] == pytest.approx(ms + 0.5)
    assert m.decode_ms(2, 100)[0] == pytest.approx(3.5)
    assert m.decode_ms(1, 200)[0] == pytest.approx(3.0)
    assert m.decode_ms(2, 200)[0] == pytest.approx(4.5)
    assert m.decode_ms(3, 300)[1] == 0.0  # no spread: no jitter
    # a step: decode D(b, c) + P x n, P from the longest prompt's graph time
    assert m.step_ms([100, 100, 100], 0) == pytest.approx(4.5)
    assert m.step_ms([100], 10) == pytest.approx(2.5 + 10 * 0.1)



def test_prefill_attention_is_anchored_at_the_longest_prompt(tmp_path: Path, tiny: Path) -> None:
    """P x 64 + A x 64^2 / 2 is the measured 6.4 ms of the longest prompt; A is the
    roofline's attention per query-key pair scaled by measured / roofline; without the
    option the file has no A (prefill linear, as before)."""
    path = write(tmp_path / "floor.json", hand_floor())
    file = floor.floor_file(path, str(tiny), "h200", "tiny", 0.0, attention=True)
    p, a = file["prefill_ms_per_token"], file["prefill_attention_ms_per_pair"]
    assert p * 64 + a * 64 * 64 / 2 == pytest.approx(6.4)
    shape, gpu = model_shape(TINY), gpu_preset("h200")
    pair = 1000 * 4 * 2 * 64 / (gpu.bf16_flops * gpu.flops_efficiency)
    assert a == pytest.approx(pair * 6.4 / (1000 * floor_seconds(shape, gpu, 0, 0, 64)))
    assert "modelled beyond 64 tokens" in file["modelled"]
    m = StepTimeModel(decode_profile(file))
    assert m.step_ms([], 64, 64 * 32) == pytest.approx(6.4)
    assert "prefill_attention_ms_per_pair" not in floor.floor_file(path, str(tiny), "h200",
                                                                   "tiny", 0.0)

def test_overhead_is_added_once_per_step(tmp_path: Path, tiny: Path) -> None:
    path = write(tmp_path / "floor.json", hand_floor())
    bare, loaded = profile_model(path, tiny, 0.0), profile_model(path, tiny, 4.0)
    for b, c in [(1, 100), (2, 150), (3, 300), (8, 1000)]:
        assert loaded.decode_ms(b, c)[0] - bare.decode_ms(b, c)[0] == pytest.approx(4.0)
    assert loaded.step_ms([], 64) == bare.step_ms([], 64) == pytest.approx(6.4)


def test_the_file_says_what_it_is(tmp_path: Path, tiny: Path) -> None:
    file = floor.floor_file(write(tmp_path / "floor.json", hand_floor()), str(tiny), "h200",
                            "tiny", 1.0)
    assert file["modelled"] == "measured floor floor.json (hand) + overhead 1 ms"
    assert file["machine"]["overhead_ms"] == 1.0 and file["machine"]["shape"] == "tiny"
    # 0.9 x 141 GB less 292,480 weight bytes, over 512 bytes per token (roofline's)
    assert file["kv_capacity_tokens"] == (0.9 * 141e9 - 292_480) // 512
    # the largest batch at the context nearest 512
    assert (file["max_num_seqs"], file["decode_ms_per_token"]) == (3, 8.0)
    assert decode_profile(file).modelled == file["modelled"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "not json", "floor file .*floor.json: .*JSON"),
    (lambda d: {k: v for k, v in d.items() if k != "decode"}, "missing required field `decode`"),
    (lambda d: {**d, "decode": [{**d["decode"][0], "graph_ms": -1.0}]}, r"\$.decode\[0\].graph_ms"),
    (lambda d: {**d, "decode": [{**d["decode"][0], "batch": 0}]}, r"\$.decode\[0\].batch"),
    (lambda d: {**d, "decode": d["decode"] + d["decode"][:1]},
     r"decode cell \('tiny', 1, 100\) measured twice"),
    (lambda d: {**d, "decode": d["decode"][-1:]},
     r"no decode cells of shape 'tiny' \(it has: other, tiny\)"),
    (lambda d: {**d, "prefill": d["prefill"][-1:]}, "no prefill cells of shape 'tiny'"),
])
def test_bad_files_are_clear_errors(tmp_path: Path, tiny: Path, mutate: Any, message: str) -> None:
    data = mutate(hand_floor())
    path = tmp_path / "floor.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(ValueError, match=message):
        floor.floor_file(path, str(tiny), "h200", "tiny", 1.0)


def test_cli_errors_are_one_line(tmp_path: Path, tiny: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "floor.json", hand_floor())
    out = tmp_path / "p" / "tiny.json"
    for args, message in [(["--gpu", "v100"], "GPU preset 'v100': known presets are"),
                          (["--overhead-ms", "-1"], "overhead -1.0 ms: must be in [0, 1e6]"),
                          (["--shape", "nope"], "no decode cells of shape 'nope'")]:
        argv = ["profile", "--floor", str(path), "--model", str(tiny), "--entry", "tiny",
                "--gpu", "h200", "--overhead-ms", "1", "--out", str(out), *args]
        with pytest.raises(SystemExit):
            floor.main(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in err
    assert not out.exists()


def test_table_holds_measured_against_the_roofline(tmp_path: Path, tiny: Path) -> None:
    data = hand_floor()
    data["decode"] = [c for c in data["decode"] if c["model"] == "tiny"]
    data["prefill"] = data["prefill"][:2]
    table = floor.floor_table(floor.load_floor(write(tmp_path / "f.json", data)),
                              gpu_preset("h200"), {"tiny": str(tiny)})
    roof = 1000 * floor_seconds(model_shape(TINY), gpu_preset("h200"), 3, 300)
    assert "| tiny | 300 | 3.00 / " in table
    assert f"7.00 / {roof:.2f} ({7 / roof:.1f}x) |" in table
    assert "| tiny | 64 | 6.40 |" in table
    with pytest.raises(ValueError, match="--model nope=...: the floor has no shape 'nope'"):
        floor.floor_table(floor.load_floor(tmp_path / "f.json"), gpu_preset("h200"),
                          {"nope": str(tiny)})


def test_quick_kernels_run_makes_a_floor_the_profile_reads(tmp_path: Path) -> None:
    """``python -m kernels_bench kernels --quick`` on this CPU (seconds), in a process that
    must not import vLLM or the project's serving dependencies (torch imports numpy
    itself where it is installed)."""
    out = tmp_path / "floor" / "cpu.json"
    code = ("import sys; from kernels_bench.__main__ import main; main(sys.argv[1:]); "
            "bad = {'vllm', 'msgspec', 'pydantic', 'zmq', 'router', 'launcher'} "
            "& {m.split('.')[0] for m in sys.modules}; assert not bad, bad")
    run = subprocess.run([sys.executable, "-c", code, "kernels", "--model", "builtin:tiny-a",
                          "--quick", "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "[4/4] tiny-a prefill T=32" in run.stderr
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["dtype"] == "float32"
    assert [(c["batch"], c["context"]) for c in data["decode"]] == [(1, 64), (4, 64)]
    assert all(c["graph_ms"] is None and c["gemm_ms"] > 0 and c["attention_ms"] > 0
               for c in data["decode"] + data["prefill"])
    file = floor.floor_file(out, "builtin:tiny-a", "h200", "a", 1.0)
    assert [c["step_ms"] for c in file["decode_curve"]] == pytest.approx(
        [c["eager_ms"] + 1.0 for c in data["decode"]])
    assert file["prefill_ms_per_token"] == pytest.approx(data["prefill"][-1]["ms"] / 32)
    StepTimeModel(decode_profile(file))


def test_kernels_bad_input_is_one_line(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from kernels_bench.commands import kernels as cli

    for args, message in [(["--model", "builtin:nope"], "built-in models are builtin:tiny-a"),
                          (["--model", str(tmp_path)], "no config.json"),
                          (["--model", "builtin:tiny-a", "--batches", "0"],
                           "0: must be at least 1")]:
        with pytest.raises(SystemExit):
            cli.main([*args, "--quick", "--out", str(tmp_path / "f.json")])
        assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "f.json").exists()
