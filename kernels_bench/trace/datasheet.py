"""``python -m kernels_bench trace datasheet``: the datasheet of one or more trace files.

Writes Markdown (sources and licenses, models, settings, counts, accuracy per model and
workflow, output-length distributions per model as in Chimera's appendix A.2, how answers
were judged, the command that rebuilds or continues the trace), the same numbers as JSON
beside it, and a PNG of the output-length distributions and accuracies.
"""

from __future__ import annotations

import shlex
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

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
    return {
        "file": path.name,
        "suite": trace.header.suite,
        "settings": trace.header.settings,
        "sources": trace.header.sources,
        "command": trace.header.command,
        "rebuild": rebuild_command(trace, path, len(problems)),
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
    }


def rebuild_command(trace: Trace, path: Path, problems: int) -> str:
    """The builder command that rebuilds (or continues) ``path``; empty if not built."""
    argv = shlex.split(trace.header.command)
    if argv[3:5] != ["trace", "build"]:
        return trace.header.command
    opts = [f"{a} {shlex.quote(b)}" for a, b in zip(argv, argv[1:])
            if a in ("--cluster", "--concurrency")]
    settings = trace.header.settings  # explicit, so a change of defaults does not matter
    opts += [f"{flag} {settings[key]}" for flag, key in (
        ("--seed", "seed"), ("--max-tokens", "max_tokens"), ("--code-timeout", "code_timeout_s"))
        if key in settings]
    return " ".join(["python -m kernels_bench trace build", *opts,
                     f"--suite {trace.header.suite}", f"--problems {problems}",
                     f"--out {path.as_posix()}"])


def _judgement(detail: str) -> str:
    """The kind of verdict in a unit's ``detail`` (extraction method, sandbox outcome)."""
    head = detail.split(";")[0].split(":")[0]
    return head.removeprefix("extracted by ").removeprefix("graded by ").strip() or "-"


def _rate(values: list[bool]) -> dict[str, float]:
    return {"n": len(values), "accuracy": float(np.mean(values)) if values else float("nan")}


def render(summaries: list[dict[str, Any]], title: str, regenerate: str) -> str:
    """The Markdown datasheet; ``regenerate`` is the datasheet command that wrote it."""
    out = [f"# {title}", "",
           f"Generated by `{regenerate}` (from the trace files); do not edit by hand. "
           "Format: docs/traces.md.", ""]
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
