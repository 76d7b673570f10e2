"""The long-sessions study's table and done-when check (``kernels_bench.lab.studies.
long_sessions``), on a hand-made analysis."""

from __future__ import annotations

from pathlib import Path

from kernels_bench.lab.studies import long_sessions as ls


def ci(value: float, low: float, high: float, verdict: str | None = None) -> dict:
    return {"value": value, "low": low, "high": high,
            **({"verdict": verdict} if verdict else {})}


RESULT = {
    "values": [{"policy": ls.BASELINE, "rate": 0.05, "e2e": ci(500, 450, 550),
                "recomputed_prefix": ci(9000, 8000, 10000), "recomputed": ci(1, 1, 1)},
               {"policy": "chimera-static:stjf", "rate": 0.05, "e2e": ci(300, 280, 320),
                "recomputed_prefix": ci(1000, 800, 1200), "recomputed": ci(1, 1, 1)},
               {"policy": "chimera-static:stjf", "rate": 0.004, "e2e": ci(100, 90, 110),
                "recomputed_prefix": ci(0, 0, 0), "recomputed": ci(1, 1, 1)}],
    "comparisons": [{"policy": "chimera-static:stjf", "rate": 0.05,
                     "e2e": ci(0.6, 0.55, 0.65, "finding"),
                     "recomputed_prefix": ci(0.11, 0.08, 0.2, "finding"),
                     "recomputed": ci(1.0, 0.9, 1.1, "unresolved")},
                    {"policy": "chimera-static:stjf", "rate": 0.004,
                     "e2e": ci(1.01, 0.99, 1.03, "unresolved"), "recomputed_prefix": None,
                     "recomputed": ci(1.0, 1.0, 1.0, "unresolved")}],
}


def test_table_marks_findings_and_the_baseline() -> None:
    text = ls.table(RESULT, {0.004: "light", 0.05: "contended"})
    assert "| contended (0.05/s) | vLLM defaults (FCFS, LRU eviction) | 500.0 [450.0, 550.0]" \
        " | 1 (baseline) |" in text
    assert "**0.600 [0.550, 0.650]** finding" in text
    assert "1.000 [0.900, 1.100] unresolved" in text
    assert "| light (0.004/s) | STJF + retention, expected return (hints)" in text


def test_done_when_reads_the_upper_bounds() -> None:
    lines = ls.done_when(RESULT, contended=0.05, light=0.004)
    assert lines[0].endswith("meets <= 0.667x and <= 0.3x")
    assert lines[1].endswith("not worse than the defaults")
    worse = {**RESULT, "comparisons": [{**RESULT["comparisons"][1],
                                        "e2e": ci(1.1, 1.05, 1.2, "finding")}]}
    assert ls.done_when(worse, 0.05, 0.004)[0].endswith("worse than the defaults")


def test_the_twin_command_replays_every_arm_with_the_recorded_gaps() -> None:
    cmd = ls.twin_command(ls.CLUSTER, ls.PROFILES, Path("t.jsonl.gz"), 3, 8, [0.004, 0.05],
                          Path("out"))
    assert cmd[cmd.index("--tool-gap") + 1] == "trace"
    assert cmd[cmd.index("--context") + 1] == "chat"
    at = cmd.index("--policies") + 1
    assert cmd[at:at + len(ls.ARMS)] == list(ls.ARMS)
    assert cmd[cmd.index("--rates") + 1:cmd.index("--rates") + 3] == ["0.004", "0.05"]
    assert "max_protected_programs=0" in ls.BASELINE and ls.BASELINE.startswith("vllm:fcfs")
