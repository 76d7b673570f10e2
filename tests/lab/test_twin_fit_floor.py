"""A floor for an unmeasured shape, the roofline fitted to measured ones
(``kernels_bench.lab.twin.fit_floor``, issue 61).

Hand-made floor: two shapes (TINY and a wider one, folders with config.json) whose every
decode and prefill cell is exactly 0.7 + 1.5 x the h200 roofline (no overhead). The fit
must recover a = 0.7 and k = 1.5 with no error, write a third shape's cells as 0.7 + 1.5 x
its own roofline on the measured grid, keep the measured cells, say "fitted" in the
device, and the floor profile must read the result (a twin profile for the new shape).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from kernels_bench.lab.twin import fit_floor, floor
from kernels_bench.lab.twin.roofline import floor_seconds, gpu_preset, model_shape

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
        "vocab_size": 1000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096}
A, K = 0.7, 1.5


def shape_dir(root: Path, name: str, **over: int) -> Path:
    (root / name).mkdir()
    (root / name / "config.json").write_text(json.dumps({**TINY, **over}))
    return root / name


def test_fit_recovers_line_and_writes_target(tmp_path: Path) -> None:
    gpu = gpu_preset("h200")
    dirs = {"tiny": shape_dir(tmp_path, "tiny"),
            "wide": shape_dir(tmp_path, "wide", hidden_size=512, intermediate_size=2048,
                              num_hidden_layers=8),
            "big": shape_dir(tmp_path, "big", hidden_size=1024, intermediate_size=4096,
                             num_hidden_layers=16)}
    shapes = {n: model_shape(json.loads((d / "config.json").read_text()))
              for n, d in dirs.items()}
    grid = [(b, c) for b in (1, 8, 64) for c in (512, 2048)]
    decode = [{"model": n, "batch": b, "context": c, "eager_ms": 9.0,
               "graph_ms": A + K * 1000 * floor_seconds(shapes[n], gpu, b, c)}
              for n in ("tiny", "wide") for b, c in grid]
    prefill = [{"model": n, "prompt_tokens": t,
                "ms": A + K * 1000 * floor_seconds(shapes[n], gpu, 0, 0, t)}
               for n in ("tiny", "wide") for t in (512, 2048)]
    src = tmp_path / "floor.json"
    src.write_text(json.dumps({"device": "hand", "torch": "0", "decode": decode,
                               "prefill": prefill}))
    out = tmp_path / "fit.json"
    fit_floor.main(["--floor", str(src), "--gpu", "h200", "--measured",
                    f"tiny={dirs['tiny']}", f"wide={dirs['wide']}",
                    "--target", f"big={dirs['big']}", "--out", str(out)])
    fitted = floor.load_floor(out)
    assert "fitted" in fitted.device and "a = 0.700 ms, k = 1.500" in fitted.torch
    assert "max error 0.0%" in fitted.torch
    big = {(c.batch, c.context): c for c in fitted.decode if c.model == "big"}
    assert sorted(big) == sorted(grid)
    for (b, c), cell in big.items():
        assert cell.floor_ms == pytest.approx(A + K * 1000 * floor_seconds(shapes["big"], gpu, b, c),
                                              abs=1e-3)
    assert len([c for c in fitted.decode if c.model != "big"]) == len(decode)
    prof = floor.floor_file(out, str(dirs["big"]), "h200", "big", 1.0)
    assert "fitted" in prof["modelled"]
    cell = min(prof["decode_curve"], key=lambda c: (c["batch_size"], c["context_tokens"]))
    assert cell["step_ms"] == pytest.approx(1.0 + big[1, 512].floor_ms, abs=1e-3)


def test_missing_shape_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "floor.json"
    src.write_bytes(msgspec.json.encode({"device": "d", "torch": "0", "decode": [],
                                         "prefill": []}))
    d = shape_dir(tmp_path, "tiny")
    with pytest.raises(SystemExit, match="no decode or prefill cells"):
        fit_floor.main(["--floor", str(src), "--gpu", "h200", "--measured", f"tiny={d}",
                        "--target", f"tiny={d}", "--out", str(tmp_path / "o.json")])
