"""The paper's Figure 5 in the twin: per scenario and load, E2E per output token against
score, every policy a point with its 95% intervals, and the table of Chimera's best point
against vLLM's balancer (issue 61).

    python -m kernels_bench.lab.studies.overload SCENARIO=BIG:RUN[,RUN...] [...]
        [--boot 2000] [--json FILE] [--plot FILE] [--table FILE]

Each RUN is a twin (or replay) output folder holding one rate; ``BIG`` is the scenario's
big model's served name (its share of calls is reported). Per RUN,
``kernels_bench.lab.studies.frontier_gap`` computes every policy's score, E2E per token and
their differences and ratios against ``vllm:fcfs`` of the same RUN, with its paired
percentile bootstrap over problems (every workflow of a drawn problem, in every policy,
drawn together). Chimera's best point at a load is, among its ``chimera:stjf`` specs (the
latency-slack sweep), the one with the lowest E2E per token over vLLM's balancer's; it is
chosen after seeing the evaluated runs (of two or three points), so it flatters Chimera.
A ratio or a difference is a finding when its interval excludes no difference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path
from typing import Any, Iterator, Sequence

from kernels_bench.lab.studies import frontier_gap

CHIMERA = "chimera:stjf"


def scenario_rows(big: str, runs: Sequence[Path], boot: int, tmp: Path) -> list[dict]:
    """frontier_gap's rows of every RUN (each against its own ``vllm:fcfs``)."""
    rows: list[dict] = []
    for run in runs:
        out = tmp / f"{run.name}.frontier.json"
        with contextlib.redirect_stdout(io.StringIO()):
            frontier_gap.main([str(run), "--big", big, "--boot", str(boot), "--json", str(out)])
        rows += json.loads(out.read_text())
    return rows


def best(rows: list[dict]) -> dict | None:
    """Chimera's point with the lowest E2E per token over the baseline's (module docstring)."""
    chim = [r for r in rows if r["policy"].startswith(CHIMERA) and "+oracle" not in r["policy"]]
    return min(chim, key=lambda r: r["e2e_per_token_ratio"]["value"], default=None)


def ci(v: dict[str, Any], fmt: str, scale: float = 1.0) -> str:
    if v["value"] is None:
        return "-"
    if v["lo"] is None:
        return format(scale * v["value"], fmt)
    lo, hi, x = (scale * v[k] for k in ("lo", "hi", "value"))
    return f"{x:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def finding(v: dict[str, Any], null: float) -> bool:
    return v["lo"] is not None and not v["lo"] <= null <= v["hi"]


def cells(data: dict[str, list[dict]]) -> Iterator[tuple[str, float, list[dict], dict | None]]:
    """(scenario, rate, its rows, Chimera's best point among them), in scenario and rate
    order."""
    for name, rows in data.items():
        for rate in sorted({r["rate"] for r in rows}):
            here = [r for r in rows if r["rate"] == rate]
            yield name, rate, here, best(here)


def bold_if_finding(v: dict[str, Any], null: float, fmt: str) -> str:
    """``ci(v)``, in bold when its interval excludes ``null``."""
    text = ci(v, fmt)
    return f"**{text}**" if finding(v, null) else text


def table(data: dict[str, list[dict]]) -> str:
    """Per scenario and rate: every policy, then Chimera's best point against vLLM's."""
    out = ["| scenario | rate/s | policy | big share | score (points) | E2E/token ms "
           "| E2E mean s | score - vllm:fcfs | E2E/token / vllm:fcfs |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, rate, here, b in cells(data):
        for r in sorted(here, key=lambda r: r["policy"]):
            mark = " (best)" if r is b else ""
            out.append(
                f"| {name} | {rate:g} | {r['policy']}{mark} | {r['big_share']['value']:.2f} | "
                f"{ci(r['score'], '.1f')} | {ci(r['e2e_per_token_s'], '.1f', 1000)} | "
                f"{ci(r['e2e_s'], '.2f')} | "
                f"{bold_if_finding(r['score_minus_baseline'], 0, '+.1f')} | "
                f"{bold_if_finding(r['e2e_per_token_ratio'], 1, '.3f')} |")
    return "\n".join(out)


def headline(data: dict[str, list[dict]]) -> str:
    """Chimera's best point against vLLM's balancer: speed-up factor and points."""
    out = ["| scenario | rate/s | Chimera's best point | vLLM E2E/token ms | Chimera E2E/token ms "
           "| factor (vLLM / Chimera) | score - vLLM (points) | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for name, rate, here, b in cells(data):
        base = next(r for r in here if r["policy"] == "vllm:fcfs")
        if b is None:
            continue
        q = b["e2e_per_token_ratio"]
        f = {"value": 1 / q["value"], "lo": None if q["hi"] is None else 1 / q["hi"],
             "hi": None if q["lo"] is None else 1 / q["lo"]}
        d = b["score_minus_baseline"]
        fast = "faster" if finding(q, 1) and q["value"] < 1 else (
            "slower" if finding(q, 1) else "latency unresolved")
        pts = "more points" if finding(d, 0) and d["value"] > 0 else (
            "fewer points" if finding(d, 0) else "points unresolved")
        claim = ("meets 1.2x and +8" if f["lo"] is not None and f["lo"] >= 1.2
                 and d["lo"] >= 8 else "short of the claim")
        out.append(f"| {name} | {rate:g} | {b['policy']} | "
                   f"{ci(base['e2e_per_token_s'], '.1f', 1000)} | "
                   f"{ci(b['e2e_per_token_s'], '.1f', 1000)} | {ci(f, '.2f')}x | "
                   f"{ci(d, '+.1f')} | {fast}, {pts}; {claim} |")
    return "\n".join(out)


def plot(data: dict[str, list[dict]], path: Path) -> None:
    """One panel per scenario and rate: score against E2E per token (ms), 95% intervals;
    Chimera's slack sweep joined as its curve, the random mixes marked as squares."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len({r["rate"] for r in rows}) for rows in data.values())
    fig, axes = plt.subplots(len(data), cols, figsize=(5.2 * cols, 4.4 * len(data)),
                             squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    names = sorted({r["policy"] for rows in data.values() for r in rows})
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    for i, name in enumerate(data):
        rates = sorted({r["rate"] for r in data[name]})
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            ax.set_visible(True)
            rows = [r for r in data[name] if r["rate"] == rate]
            curve = sorted((r for r in rows if r["policy"].startswith(CHIMERA)
                            and "+oracle" not in r["policy"]),
                           key=lambda r: r["e2e_per_token_s"]["value"])
            ax.plot([1000 * r["e2e_per_token_s"]["value"] for r in curve],
                    [r["score"]["value"] for r in curve], "-", color="tab:red", lw=1,
                    alpha=0.6, label="Chimera's slack sweep")
            for r in rows:
                x, y = r["e2e_per_token_s"], r["score"]
                ax.errorbar([1000 * x["value"]], [y["value"]],
                            xerr=[[1000 * (x["value"] - x["lo"])], [1000 * (x["hi"] - x["value"])]],
                            yerr=[[y["value"] - y["lo"]], [y["hi"] - y["value"]]],
                            fmt="s" if r["policy"].startswith("random_mix") else "o", ms=5,
                            capsize=3, label=r["policy"], color=colors[r["policy"]])
            ax.set(xlabel="E2E per output token (ms)", ylabel="score (points)",
                   title=f"{name}, {rate:g} workflows/s")
            ax.legend(fontsize=6, loc="best")
    fig.suptitle("Twin (modelled latency, recorded outcomes): score vs E2E per token, 95% "
                 "intervals over problems", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("scenarios", nargs="+", metavar="SCENARIO=BIG:RUN[,RUN...]")
    p.add_argument("--boot", type=int, default=2000)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--table", type=Path, help="also write the markdown tables here")
    a = p.parse_args(argv)
    tmp = (a.json or Path("overload.json")).parent
    data = {}
    for spec in a.scenarios:
        name, rest = spec.split("=", 1)
        big, runs = rest.split(":", 1)
        data[name] = scenario_rows(big, [Path(r) for r in runs.split(",")], a.boot, tmp)
    text = headline(data) + "\n\n" + table(data)
    print(text)
    if a.table:
        a.table.write_text(text + "\n")
    if a.json:
        a.json.write_text(json.dumps(data, indent=1))
    if a.plot:
        plot(data, a.plot)


if __name__ == "__main__":
    main()
