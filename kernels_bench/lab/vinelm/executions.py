"""Recorded real executions of workflow-trie nodes: the file format and its executor.

One file holds, for one workflow template and one problem suite, real executions of
trie nodes: node ``(l1, ..., lk)`` of problem x is the k-th invocation run by model
``lk`` after the checkpoint of ``(l1, ..., lk-1)`` (the stage outputs so far). JSON Lines,
plain or gzip (appended one gzip member per record, as trace files are): line 1 an
:class:`ExecHeader`, then one :class:`Execution` per (problem, prefix). Single-model
prefixes may come from a trace file (``source = "trace"``, its recorded stages),
mixed ones from engines (``source = "engine"``).

``success`` is whether the answer after this invocation is right, judged on its own
output (False for a non-answering invocation); success is absorbing when replayed: a
node whose prefix already succeeded is never executed (the workflow stopped there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Mapping, Sequence

import msgspec

from kernels_bench.lab.vinelm.executors import Prices
from router.trace_format import Name, Stage, TraceFormatError, iter_lines
from router.vinelm.profiling import MissingExecution, Outcome
from router.vinelm.template import Invocation
from router.vinelm.trie import Path_

FORMAT: Final = "hetserve-vinelm-executions"
VERSION: Final = 1


class ExecHeader(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="header",
                 tag_field="kind"):
    format: Literal["hetserve-vinelm-executions"]
    version: int
    suite: Name
    workflow: Name
    """The template's name."""
    signature: list[list[Any]]
    """Per depth: the invocation's stage and admissible models (``WorkflowTemplate.signature``)."""
    settings: dict[str, Any]
    """The trace builder's generation settings (seed, max_tokens, prompt_version, ...)."""
    sources: list[dict[str, str]]
    command: str = ""


class Execution(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="execution",
                tag_field="kind"):
    problem_id: Name
    prefix: list[str]
    """The models of invocations 1..k; the last one ran this invocation."""
    stage: Stage
    success: bool
    final_answer: str | None
    detail: str
    source: Literal["trace", "engine"]


_decoder = msgspec.json.Decoder(ExecHeader | Execution)


def read_executions(path: str | os.PathLike[str]
                    ) -> tuple[ExecHeader, dict[tuple[str, Path_], Execution]]:
    """The validated header and executions by (problem, prefix)."""
    path = Path(path)
    header: ExecHeader | None = None
    out: dict[tuple[str, Path_], Execution] = {}
    for n, line in iter_lines(path):
        where = f"{path}: line {n}"
        try:
            rec = _decoder.decode(line)
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as e:
            raise TraceFormatError(f"{where}: {e}") from None
        if header is None:
            if not isinstance(rec, ExecHeader):
                raise TraceFormatError(f"{where}: the first record must be the header")
            if rec.version != VERSION:
                raise TraceFormatError(f"{where}: executions format version {rec.version}; "
                                       f"this code reads version {VERSION}")
            header = rec
            continue
        if isinstance(rec, ExecHeader):
            raise TraceFormatError(f"{where}: a second header")
        key = (rec.problem_id, tuple(rec.prefix))
        depth = len(rec.prefix)
        if not 1 <= depth <= len(header.signature):
            raise TraceFormatError(f"{where}: prefix {rec.prefix} is not a node of the "
                                   f"{len(header.signature)}-deep trie")
        stage, models = header.signature[depth - 1]
        if rec.stage.role != stage or rec.prefix[-1] not in models:
            raise TraceFormatError(f"{where}: depth {depth} runs {stage} with one of "
                                   f"{models}, not {rec.stage.role} with {rec.prefix[-1]}")
        if key in out:
            raise TraceFormatError(f"{where}: duplicate execution of {rec.prefix} for "
                                   f"{rec.problem_id}")
        out[key] = rec
    if header is None:
        raise TraceFormatError(f"{path}: empty file (no header line)")
    return header, out


def succeeded_by(table: Mapping[tuple[str, Path_], Execution], problem: str,
                 prefix: Path_) -> bool:
    """Whether the answer is right after ``prefix`` (success is absorbing: any node on
    the path from the root to ``prefix`` answered right)."""
    return any(table[problem, prefix[:j]].success for j in range(1, len(prefix) + 1))


@dataclass
class RecordedExecutor:
    """The profiler's executor over recorded executions: ``run`` returns a node's recorded
    outcome, absorbing success included; a node never executed raises
    ``MissingExecution`` (only nodes below a success are, and the profilers never ask)."""

    table: Mapping[tuple[str, Path_], Execution]
    prices: Prices

    def run(self, problem: str, prefix: Path_) -> Outcome:
        e = self.table.get((problem, prefix))
        if e is None:
            raise MissingExecution(f"no recorded execution of {list(prefix)} for {problem!r}")
        return Outcome(succeeded_by(self.table, problem, prefix),
                       self.prices.cost(prefix[-1], e.stage.prompt_tokens,
                                        e.stage.output_tokens), e.stage.latency_s)

    def problems(self) -> list[str]:
        """Problems whose every node not below a success is recorded (complete trees)."""
        return sorted({p for p, _ in self.table})

    def complete(self, problem: str, invocations: Sequence[Invocation]) -> bool:
        frontier: list[Path_] = [()]
        while frontier:
            parent = frontier.pop()
            if parent and (self.table[problem, parent].success
                           or len(parent) == len(invocations)):
                continue
            for m in invocations[len(parent)].models:
                child = parent + (m,)
                if (problem, child) not in self.table:
                    return False
                frontier.append(child)
        return True
