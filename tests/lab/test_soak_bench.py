"""The soak's metric reading, table and trends (``kernels_bench.lab.faults.soak``,
``kernels_bench.lab.commands.soak``; the soak itself runs real engines: docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_bench.lab.commands.soak import by_kind, main, plot, table, trends
from kernels_bench.lab.faults.soak import _sum

METRICS = """# HELP hetserve_engine_up 1 if the router routes to the engine, else 0
hetserve_engine_up{engine="tiny-a-0",model="tiny-a"} 1.0
hetserve_engine_up{engine="tiny-a-1",model="tiny-a"} 0.0
hetserve_engine_kv_index_blocks{engine="tiny-a-0",model="tiny-a"} 12.0
hetserve_engine_kv_index_blocks{engine="tiny-a-1",model="tiny-a"} 30.0
hetserve_programs 4.0
"""


def test_sum_reads_one_label_set_or_all() -> None:
    assert _sum(METRICS, "hetserve_engine_up", 'engine="tiny-a-1"') == 0.0
    assert _sum(METRICS, "hetserve_engine_kv_index_blocks") == 42.0
    assert _sum(METRICS, "hetserve_programs") == 4.0
    assert _sum(METRICS, "hetserve_asyncio_tasks") is None


def result() -> dict:
    outcomes = {"ok": 10, "error": 1, "refused": 0, "cut": 2, "lost": 0, "abandoned": 3}
    samples = [{"t": 100.0 + t, "process": "router-0", "source": "psutil",
                "rss_bytes": (100 + t) * 2**20, "fds": 40} for t in range(0, 600, 5)]
    return {"t_start": 100.0, "duration_s": 600.0, "concurrency": 4, "steady": outcomes,
            "outcomes": outcomes, "samples": samples, "resent": 3, "steady_resent": 0,
            "resent_unanswered": 5, "steady_resent_unanswered": 1,
            "not_ok": [], "timeline_s": 10.0,
            "timeline": {"0": {"ok": 30}, "5": {"ok": 20, "cut": 2}},
            "faults": [{"kind": "kill-router-worker", "target": "router-0", "at": 150.0,
                        "routed_around_s": None, "back_s": 8.25, "outcomes": outcomes,
                        "resent": 3, "resent_unanswered": 4},
                       {"kind": "stop-engine", "target": "tiny-a-1", "at": 250.0,
                        "routed_around_s": 1.5, "back_s": None, "outcomes": outcomes,
                        "resent": 0, "resent_unanswered": 1}]}


def test_table_and_trends(tmp_path: Path) -> None:
    text = table(result())
    assert "| 50 | kill-router-worker | router-0 | 10 | 1 | 0 | 2 | 0 | 3 | 3 | 4 | - | 8.2 s |" \
        in text
    assert "| 150 | stop-engine | tiny-a-1 | 10 | 1 | 0 | 2 | 0 | 3 | 0 | 1 | 1.50 s | not back |" \
        in text
    assert ("| | **total** | | **10** | **1** | **0** | **2** | **0** | **3** | **3** | **5** "
            "| | |") in text
    timed = result()
    timed["faults"][1] |= {"worker_down_s": [0.25, 1.5], "launcher_saw_s": None}
    assert "| 1.50 s (workers 0.25, 1.50; launcher -) | not back |" in table(timed)
    timed["faults"][1] |= {"worker_last_sent_s": [-0.25, -0.5], "worker_last_received_s":
                           [-0.25, 0.0]}
    assert ("| 1.50 s (workers 0.25, 1.50; their last snapshot sent -0.25, -0.50, read -0.25, "
            "0.00; launcher -) | not back |") in table(timed)
    two = result()
    two["faults"].append({**two["faults"][1], "routed_around_s": 2.5, "back_s": 60.0})
    rows = by_kind(two)
    assert ("| kill-router-worker | 1 | 10 | 1 | 0 | 2 | 0 | 3 | - | - | 8.25 / 8.25 / 8.25 s "
            "| 0 |") in rows
    assert ("| stop-engine | 2 | 20 | 2 | 0 | 4 | 0 | 6 | 1 of 2 | 1.50 / 2.00 / 2.50 s | "
            "60.00 / 60.00 / 60.00 s | 1 |") in rows
    # at 5 min (t = 300 s after the start): 400 MiB; last sample 695 MiB
    assert "| router-0 (psutil) | rss_bytes | 400 MiB | 695 MiB | 100 MiB | 695 MiB |" \
        in trends(result())
    plot(result(), tmp_path / "soak.png")
    assert (tmp_path / "soak.png").stat().st_size > 0


@pytest.mark.parametrize("flag, value", [
    ("--duration-s", "-5"), ("--duration-s", "0"), ("--sample-s", "nan"),
    ("--settle-s", "inf"), ("--request-timeout-s", "1e9"), ("--concurrency", "0"),
])
def test_bad_flags_are_refused_before_anything_starts(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([flag, value])
    assert exc.value.code == 2 and flag in capsys.readouterr().err
