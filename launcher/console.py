"""The launcher's terminal output: short event lines, one live status line, tables.

Everything printed also goes to the run's ``launcher.log`` with a timestamp.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

_SPINNER = "|/-\\"


class Console:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.log_path: Path | None = None
        self._status = ""
        self._tick = 0

    def line(self, text: str) -> None:
        """Print one line (above the status line, which it redraws)."""
        self._clear()
        for ln in text.splitlines() or [""]:
            self.stream.write(f"[launcher] {ln}\n" if ln else "\n")
        self.log(text)
        self._draw()

    def raw(self, text: str) -> None:
        """Print ``text`` as it is (tables, the plan)."""
        self._clear()
        self.stream.write(text.rstrip("\n") + "\n")
        self.log(text)
        self._draw()

    def status(self, text: str) -> None:
        """Replace the live status line (terminals only; elsewhere events suffice)."""
        if not self.tty:
            return
        self._clear()
        self._status = text
        self._tick += 1
        self._draw()

    def done(self) -> None:
        """Remove the status line."""
        self._clear()
        self._status = ""

    def _clear(self) -> None:
        if self.tty and self._status:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def _draw(self) -> None:
        if self.tty and self._status:
            self.stream.write(f"{_SPINNER[self._tick % len(_SPINNER)]} {self._status}")
        self.stream.flush()

    def log(self, text: str) -> None:
        """Append ``text`` to the log file only."""
        if self.log_path is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.log_path, "a", encoding="utf-8") as f:
            for ln in text.splitlines():
                f.write(f"{stamp} {ln}\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
