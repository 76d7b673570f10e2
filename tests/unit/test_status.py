"""``python -m kernels_bench status``: README.md's "Where it stands" table is the one the
command prints, every number read from the JSON file its row cites."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernels_bench.commands import status

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_table_is_the_json_files() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert status.block(readme) == status.table(), (
        "README.md's status table differs from the JSON it cites: run "
        "python -m kernels_bench status --write README.md")


def test_at_most_eight_rows_each_citing_an_existing_file_and_page() -> None:
    assert 1 <= len(status.CLAIMS) <= 8
    for c in status.CLAIMS:
        assert (ROOT / c.source).is_file() and (ROOT / c.link).is_file(), c


def test_a_number_comes_from_its_file() -> None:
    """Change a cited value and the table changes: nothing is hard-coded."""
    claim = status.CLAIMS[0]
    records = json.loads((ROOT / claim.source).read_text(encoding="utf-8"))
    rec = next(r for r in records if r["policy"] == status.KNN_RULE)
    rec["score_minus_baseline"] = {"value": 3.25, "lo": 1.0, "hi": 5.5}
    number, verdict = claim.read(records)
    assert number.startswith("+3.2 [+1.0, +5.5] points") and verdict.startswith("more points")


@pytest.mark.parametrize("interval,verdict", [
    ({"value": 0.9, "lo": 0.8, "hi": 0.95}, "faster (finding)"),
    ({"value": 1.1, "lo": 1.05, "hi": 1.2}, "slower (finding)"),
    ({"value": 0.99, "lo": 0.97, "hi": 1.01}, "E2E per token: unresolved"),
])
def test_verdicts_follow_the_interval(interval: dict[str, float], verdict: str) -> None:
    assert status._verdict(status.E2E_TOKEN, interval) == verdict


def test_write_and_check(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text(f"# x\n\n{status.BEGIN}\n| stale |\n{status.END}\n\nafter\n", encoding="utf-8")
    run = [sys.executable, "-m", "kernels_bench", "status"]
    assert subprocess.run([*run, "--check", str(page)], cwd=ROOT).returncode == 1
    assert subprocess.run([*run, "--write", str(page)], cwd=ROOT).returncode == 0
    text = page.read_text(encoding="utf-8")
    assert status.block(text) == status.table() and text.endswith("\nafter\n")
    assert subprocess.run([*run, "--check", str(page)], cwd=ROOT).returncode == 0
    assert re.search(r"^# x$", text, re.M)
