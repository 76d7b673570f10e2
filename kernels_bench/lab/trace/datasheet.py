"""``python -m kernels_bench trace datasheet``: the datasheet of one or more trace files.

Writes Markdown (sources and licenses, models, settings, counts, accuracy per model and
workflow, output-length distributions per model as in Chimera's appendix A.2, how answers
were judged, the command that rebuilds or continues the trace), the same numbers as JSON
beside it, and a PNG of the output-length distributions and accuracies. A trace with
sampled runs also gets their counts (samples per unit) and P(correct) per model and
workflow under sampling; every other number is the greedy runs'.
"""

from __future__ import annotations

import shlex
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from kernels_bench.lab.trace.suites import load_problems
from router.trace_format import Trace

PERCENTILES = (10, 25, 50, 75, 90, 99)


def distribution(values: list[int]) -> dict[str, float]:
    """n, mean, std, min, percentiles and max of ``values``."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"n": 0}
    out = {"n": int(a.size), "mean": float(a.mean()), "std": float(a.std()),
           "min": float(a.min())}
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    out["max"] = float(a.max())
    return out


def summarize(trace: Trace, path: Path) -> dict[str, Any]:
    """Every number the datasheet shows, for one trace."""
    planned = {src["name"] for src in trace.header.sources if "engine" in src}
    models = sorted(set(trace.models) | planned)  # a planned model may have no unit yet
    workflows = list(trace.header.workflows)
    acc: dict[str, dict[str, list[bool]]] = {m: defaultdict(list) for m in models}
    stage_len: dict[str, list[int]] = defaultdict(list)
    run_len: dict[str, dict[str, list[int]]] = {m: defaultdict(list) for m in models}
    truncated: Counter[str] = Counter()
    judged: dict[str, dict[str, list[bool]]] = {m: defaultdict(list) for m in models}
    for run in trace.runs:
        for m, mr in run.models.items():
            acc[m][run.workflow].append(mr.correct)
            run_len[m][run.workflow].append(mr.total_output_tokens)
            stage_len[m] += [s.output_tokens for s in mr.stages]
            truncated[m] += sum(s.finish_reason == "length" for s in mr.stages)
            judged[m][_judgement(mr.detail)].append(mr.correct)
    problems = sorted({r.problem_id for r in trace.runs})
    expected = len(problems) * len(workflows)
    sampled = {"samples": sampling_summary(trace, models, workflows)} if trace.has_samples \
        else {}
    return {
        "file": path.name,
        "suite": trace.header.suite,
        "settings": trace.header.settings,
        "sources": trace.header.sources,
        "command": trace.header.command,
        "rebuild": rebuild_command(trace, path, problems),
        "problems": len(problems),
        "workflows": trace.header.workflows,
        "units": {m: sum(len(v) for v in acc[m].values()) for m in models},
        "units_expected_per_model": expected,
        "complete_runs": len(trace.complete_runs(models)),
        "accuracy": {m: {w: _rate(acc[m][w]) for w in workflows} | {"all": _rate(
            [c for w in workflows for c in acc[m][w]])} for m in models},
        "stage_output_tokens": {m: distribution(stage_len[m]) for m in models},
        "workflow_output_tokens": {m: {w: distribution(run_len[m][w]) for w in workflows}
                                   for m in models},
        "truncated_stages": {m: truncated[m] for m in models},
        "stages": {m: len(stage_len[m]) for m in models},
        "judged": {m: {k: _rate(v) for k, v in sorted(judged[m].items(),
                                                      key=lambda kv: -len(kv[1]))}
                   for m in models},
    } | sampled


def sampling_summary(trace: Trace, models: list[str], workflows: list[str]) -> dict[str, Any]:
    """Per model: sampled runs, samples per unit (over the units with any), the units
    whose samples disagree (0 < P(correct) < 1), and P(correct) (the share of correct
    samples, averaged over units) per workflow and over all."""
    per: dict[str, dict[str, list[float]]] = {m: defaultdict(list) for m in models}
    counts: dict[str, list[int]] = defaultdict(list)
    for run in trace.runs:
        for m, runs in run.samples.items():
            counts[m].append(len(runs))
            per[m][run.workflow].append(run.p_correct(m))
    out: dict[str, Any] = {}
    for m in models:
        p_all = [p for w in workflows for p in per[m][w]]
        out[m] = {"runs": sum(counts[m]), "units": len(counts[m]),
                  "per_unit": distribution(counts[m]),
                  "disagreeing_units": sum(0 < p < 1 for p in p_all),
                  "p_correct": {w: _mean(per[m][w]) for w in workflows} | {"all": _mean(p_all)}}
    return out


def rebuild_command(trace: Trace, path: Path, problems: list[str]) -> str:
    """The builder command that rebuilds (or continues) ``path``; empty if not built; a
    ``#`` line where ``problems`` are not the suite's first ones (a file cut by
    ``trace compact --without``), which no one build makes."""
    argv = shlex.split(trace.header.command)
    if argv[3:5] != ["trace", "build"]:
        return trace.header.command
    first = {p.id for p in load_problems(trace.header.suite, len(problems),
                                         int(trace.header.settings.get("seed", 0)))
             } if problems else set()
    if set(problems) != first:
        return (f"# {len(problems)} problems that are not the suite's first {len(problems)} "
                f"(a file cut by `trace compact --without`): no one build command makes it")
    opts = [f"{a} {shlex.quote(b)}" for a, b in zip(argv, argv[1:])
            if a in ("--cluster", "--concurrency")]
    settings = trace.header.settings  # explicit, so a change of defaults does not matter
    opts += [f"{flag} {settings[key]}" for flag, key in (
        ("--seed", "seed"), ("--max-tokens", "max_tokens"), ("--code-timeout", "code_timeout_s"))
        if key in settings]
    models = trace.models
    if "sampling" in settings:
        k = max((len(v) for r in trace.runs for v in r.samples.values()), default=0)
        opts += [f"--samples {k}", f"--temperature {settings['sampling']['temperature']}",
                 f"--top-p {settings['sampling']['top_p']}"]
        models = sorted({m for r in trace.runs for m in r.samples}) or models
    opts.append("--models " + " ".join(shlex.quote(m) for m in models))
    return " ".join(["python -m kernels_bench trace build", *opts,
                     f"--suite {trace.header.suite}", f"--problems {len(problems)}",
                     f"--out {path.as_posix()}"])


def _judgement(detail: str) -> str:
    """The kind of verdict in a unit's ``detail`` (extraction method, sandbox outcome)."""
    head = detail.split(";")[0].split(":")[0]
    return head.removeprefix("extracted by ").removeprefix("graded by ").strip() or "-"


def _rate(values: list[bool]) -> dict[str, float]:
    return {"n": len(values), "accuracy": float(np.mean(values)) if values else float("nan")}


def _mean(values: list[float]) -> dict[str, float]:
    """P(correct) averaged over units: ``accuracy`` as ``_rate``'s, ``n`` units."""
    return {"n": len(values), "accuracy": float(np.mean(values)) if values else float("nan")}


def render(summaries: list[dict[str, Any]], title: str, regenerate: str) -> str:
    """The Markdown datasheet; ``regenerate`` is the datasheet command that wrote it."""
    out = [f"# {title}", "",
           f"Generated by `{regenerate}` (from the trace files); do not edit by hand. "
           "Format: docs/research/traces.md.", ""]
    for s in summaries:
        models = list(s["units"])
        out += [f"## `{s['file']}`: suite `{s['suite']}`", "", "**Sources and licenses**", ""]
        out += [f"- {', '.join(f'{k}: {v}' for k, v in src.items())}" for src in s["sources"]]
        out += ["", "**Settings**: " + ", ".join(f"{k} = {v}" for k, v in s["settings"].items()),
                "", "**Workflows**: " + "; ".join(f"`{w}` ({' -> '.join(r)})"
                                                  for w, r in s["workflows"].items()), ""]
        out += [f"**Counts**: {s['problems']} problems; units (one model's run of one workflow "
                f"on one problem) per model: " + ", ".join(
                    f"{m} {n}/{s['units_expected_per_model']}" for m, n in s["units"].items())
                + f"; workflow runs finished by every model: {s['complete_runs']}.", ""]
        out += ["**Accuracy** (share of correct final answers; n in parentheses)", "",
                "| model | " + " | ".join(s["workflows"]) + " | all |",
                "|---" * (len(s["workflows"]) + 2) + "|"]
        for m in models:
            cells = [_acc_cell(s["accuracy"][m][w]) for w in [*s["workflows"], "all"]]
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out += ["", "**Output tokens per stage (LLM call)**", "", _dist_table(
            {m: s["stage_output_tokens"][m] for m in models}), ""]
        trunc = ", ".join(f"{m} {s['truncated_stages'][m]}/{s['stages'][m]}" for m in models)
        out += [f"Stages cut by `max_tokens`: {trunc}.", "",
                "**Output tokens per workflow run** (sum over its stages)", "",
                _dist_table({f"{m} / {w}": s["workflow_output_tokens"][m][w]
                             for m in models for w in s["workflows"]}), ""]
        if "samples" in s:
            out += _render_samples(s["samples"], list(s["workflows"]),
                                   s["units_expected_per_model"], s["settings"])
        out += ["**How answers were judged** (verdict kind: accuracy and units of that "
                "kind): " + "; ".join(
                    f"{m}: " + (", ".join(f"{k} {_acc_cell(v)}"
                                          for k, v in s["judged"][m].items()) or "-")
                    for m in models), ""]
        caption = ("**Command** (rebuilds the file, or continues it after an interruption; "
                   "with a larger `--problems` it extends it, skipping every finished unit)"
                   if " trace build " in s["rebuild"] else "**Command**")
        out += [caption, "", "```", s["rebuild"], "```", ""]
        if s["command"] and s["command"] != s["rebuild"]:
            out += [f"(The file was started with `{s['command']}`.)", ""]
    return "\n".join(out)


def _render_samples(samples: dict[str, Any], workflows: list[str], expected: int,
                    settings: dict[str, Any]) -> list[str]:
    """The sampled runs' section of the Markdown datasheet."""
    cfg = settings.get("sampling", {})
    out = ["**Sampled runs** (beside the greedy ones: " + ", ".join(
        f"{k} {v}" for k, v in cfg.items()) + ", a seed per run): " + "; ".join(
        f"{m} {v['runs']} runs in {v['units']}/{expected} units, "
        + (f"{v['per_unit']['min']:.0f}-{v['per_unit']['max']:.0f} per unit"
           if v["units"] else "none")
        + f", {v['disagreeing_units']} units whose samples disagree"
        for m, v in samples.items()) + ".", "",
        "**P(correct) with sampling** (per unit the share of its samples that are correct, "
        "averaged over units; n units in parentheses)", "",
        "| model | " + " | ".join(workflows) + " | all |", "|---" * (len(workflows) + 2) + "|"]
    for m, v in samples.items():
        cells = [_acc_cell(v["p_correct"][w]) for w in [*workflows, "all"]]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return [*out, ""]


def _acc_cell(a: dict[str, float]) -> str:
    return "-" if not a["n"] else f"{100 * a['accuracy']:.1f}% ({a['n']})"


def _dist_table(rows: dict[str, dict[str, float]]) -> str:
    cols = ["n", "mean", "std", "min", *(f"p{p}" for p in PERCENTILES), "max"]
    lines = ["| | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, d in rows.items():
        cells = [f"{d[c]:.0f}" if c in d else "-" for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summaries: list[dict[str, Any]], traces: list[Trace], path: Path) -> None:
    """Per trace (one column): histograms of output tokens per stage, one line per model;
    below, accuracy per model and workflow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(traces), figsize=(5.5 * len(traces), 7), squeeze=False)
    for (ax, bx), s, t in zip(axes.T, summaries, traces):
        lens = {m: [st.output_tokens for r in t.runs if m in r.models
                    for st in r.models[m].stages] for m in t.models}
        bins = np.linspace(0, max(max(v, default=1) for v in lens.values()), 41)
        for m, values in lens.items():
            ax.hist(values, bins=bins, histtype="step", linewidth=1.5, label=m)
        ax.set_title(f"{s['file']} ({s['suite']})")
        ax.set_xlabel("output tokens per stage")
        ax.set_ylabel("stages")
        ax.legend(fontsize=7)
        models, workflows = list(s["units"]), list(s["workflows"])
        width = 0.8 / max(1, len(workflows))
        for i, w in enumerate(workflows):
            acc = [100 * s["accuracy"][m][w]["accuracy"] if s["accuracy"][m][w]["n"] else 0.0
                   for m in models]
            bx.bar(np.arange(len(models)) + (i - (len(workflows) - 1) / 2) * width, acc,
                   width, label=w)
        bx.set_xticks(np.arange(len(models)), models, fontsize=7, rotation=10)
        bx.set_ylabel("correct final answers (%)")
        bx.set_ylim(0, 100)
        bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
