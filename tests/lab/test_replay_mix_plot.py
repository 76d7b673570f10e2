"""The replay's mix plot: drawn when random_mix ran, on its big model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernels_bench.lab.replay.output import MIX_PLOT, PLOTS, big_model_of, plots_of, write_plots


def summary(with_mix: bool) -> dict[str, Any]:
    specs = [{"label": "chimera:stjf", "router": "chimera", "overrides": []},
             {"label": "vllm:fcfs", "router": "vllm", "overrides": []}]
    shares = {"chimera:stjf": 0.27, "vllm:fcfs": 0.5}
    if with_mix:
        for s in (0.1, 0.5):
            label = f'random_mix:fcfs@share={s},big_model="b"'
            specs.append({"label": label, "router": "random_mix",
                          "overrides": [["share", s], ["big_model", "b"]]})
            shares[label] = s
    runs, values = [], []
    for label, share in shares.items():
        for repeat in (0, 1):
            runs.append({"policy": label, "rate": 3.0, "repeat": repeat, "summary": {
                "traffic": {"a": {"calls": 1 - share}, "b": {"calls": share}}}})
        ci = {"value": 1.0, "low": 0.5, "high": 1.5}
        values.append({"policy": label, "rate": 3.0, "score": {"value": 40 + 20 * share,
                                                                "low": 35, "high": 55},
                       "e2e_s.mean": ci, "e2e_per_token_s.mean": ci})
    return {"meta": {"policies": specs, "rates": [3.0]}, "runs": runs,
            "intervals": {"values": values}}


def test_mix_plot_only_when_random_mix_ran(tmp_path: Path) -> None:
    with_mix, without = summary(True), summary(False)
    assert big_model_of(with_mix) == "b" and big_model_of(without) is None
    assert plots_of(with_mix) == [*PLOTS, MIX_PLOT] and plots_of(without) == list(PLOTS)
    for name, s in (("with", with_mix), ("without", without)):
        folder = tmp_path / name
        folder.mkdir()
        write_plots(folder, s, [])
        assert sorted(p.name for p in folder.iterdir()) == sorted(plots_of(s))
        assert all((folder / p).stat().st_size > 1000 for p in plots_of(s))
