"""The workflow trace format (version 1): schema, validation, reading and appending.

A trace file is JSON Lines, plain (``.jsonl``) or gzip-compressed (``.jsonl.gz``, possibly
several gzip members back to back, as the builder appends them). Line 1 is a
:class:`Header`; every further line is a :class:`Unit`: one model's run of one workflow on
one problem. :func:`load_trace` validates every line (an error names the file, the line,
the unit's key and the bad field) and groups units into :class:`WorkflowRun` objects, one
per (problem, workflow), holding each model's :class:`ModelRun`. See docs/research/traces.md.

A unit is a model's greedy run (``sample`` absent: temperature 0, what every trace holds)
or one of its sampled runs (``sample`` = k >= 0, with the header's ``settings["sampling"]``
and its own ``seed``). A (problem, workflow, model) may have both: the greedy run is
``WorkflowRun.models[model]``, the samples ``WorkflowRun.samples[model]``, and a quality
label is P(correct), the mean over the samples where there are any
(``WorkflowRun.p_correct``). Files without samples read exactly as before.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec

FORMAT: Final = "hetserve-trace"
VERSION: Final = 1

NonNeg = Annotated[int, msgspec.Meta(ge=0)]
NonNegF = Annotated[float, msgspec.Meta(ge=0)]
Name = Annotated[str, msgspec.Meta(min_length=1)]


class TraceFormatError(ValueError):
    """A trace file or record that does not follow the format."""


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One chat message as sent to the engine."""

    role: Literal["system", "user", "assistant"]
    content: str


class Stage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One LLM call of a workflow run."""

    index: NonNeg
    role: Name
    """The agent role (``planner``, ``solver``, ``verifier``, ``coder``, ``qa``, ...)."""
    messages: list[Message]
    """Exactly what was sent: the role's system prompt, then the user turn with the
    problem and the accumulated history of earlier stages."""
    prompt_tokens: NonNeg
    output_tokens: NonNeg
    output_text: str
    finish_reason: str
    """``stop`` or ``length`` (hit ``max_tokens``), as the engine reported it."""
    latency_s: NonNegF
    """Wall time of the call as the builder saw it (depends on the load of the build)."""
    tool_gap_s: NonNegF | None = None
    """Seconds the agent spent after this call before its next one (a tool's run, its own
    work), where the trace records it; None: not recorded (the shipped traces)."""


class Unit(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True,
           tag="unit", tag_field="kind"):
    """One model's run of one workflow on one problem: the builder's unit of work."""

    key: Name
    """``<problem_id>|<workflow>|<model>`` (greedy) or ``...|<model>|<sample>``: unique."""
    problem_id: Name
    workflow: Name
    model: Name
    user_prompt: str
    """The problem as the agent's user gave it (the same for every stage and model)."""
    reference: str
    """Math: the reference answer; code: the task id of the tests that judged it."""
    stages: list[Stage]
    final_answer: str | None
    """Math: the extracted answer (None: none found); code: the extracted program."""
    correct: bool
    score: float
    """The suite's own score (reasoning-gym's ``score_answer``; code: 1.0 or 0.0)."""
    total_output_tokens: NonNeg
    latency_s: NonNegF
    detail: str = ""
    """Why it was judged so (extraction method, sandbox outcome)."""
    sample: NonNeg | None = None
    """None (absent from the file): the greedy run; k: the k-th sampled run."""
    seed: NonNeg | None = None
    """A sampled run's seed (``sample_seed``); stage i sends ``stage_seed(seed, i)``."""


class Header(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="header",
             tag_field="kind"):
    """The first line of a trace: what it is and how it was made."""

    format: Literal["hetserve-trace"]
    version: int
    suite: Name
    """``math``, ``code`` or ``champ``."""
    workflows: dict[str, list[str]]
    """Workflow id -> its stage roles in order."""
    settings: dict[str, Any]
    """Generation and problem settings (seed, max_tokens, temperature, ...)."""
    sources: list[dict[str, str]]
    """Data sets and models used, with their licenses."""
    command: str = ""
    """The command that built it."""


class ModelRun(msgspec.Struct, frozen=True):
    """One model's part of a :class:`WorkflowRun` (a validated :class:`Unit`)."""

    model: str
    stages: list[Stage]
    final_answer: str | None
    correct: bool
    score: float
    total_output_tokens: int
    latency_s: float
    detail: str
    sample: int | None = None
    """None: the greedy run; k: the k-th sampled run."""

    def remaining_output_tokens(self, stage: int) -> int:
        """Output tokens of stages ``stage`` and later (the length predictor's target)."""
        return sum(s.output_tokens for s in self.stages[stage:])


class WorkflowRun(msgspec.Struct, frozen=True):
    """One workflow on one problem, with every model's run of it."""

    problem_id: str
    workflow: str
    roles: list[str]
    user_prompt: str
    reference: str
    models: dict[str, ModelRun]
    """Each model's greedy run."""
    samples: dict[str, list[ModelRun]] = msgspec.field(default_factory=dict)
    """Each model's sampled runs, by sample index (absent: none recorded)."""

    def outcomes(self, model: str) -> list[ModelRun]:
        """What a quality label averages: ``model``'s sampled runs where it has any, else
        its greedy run; KeyError when it has neither."""
        return self.samples.get(model) or [self.models[model]]

    def p_correct(self, model: str) -> float:
        """P(correct) of ``model`` here: the share of its ``outcomes`` that are correct."""
        runs = self.outcomes(model)
        return sum(r.correct for r in runs) / len(runs)

    def expected_score(self, model: str) -> float:
        """The mean score of ``model``'s ``outcomes``."""
        runs = self.outcomes(model)
        return sum(r.score for r in runs) / len(runs)


class Trace(msgspec.Struct, frozen=True):
    """A loaded, validated trace."""

    header: Header
    runs: list[WorkflowRun]

    @property
    def models(self) -> list[str]:
        """Every model that appears (greedy or sampled), sorted."""
        return sorted({m for r in self.runs for m in (*r.models, *r.samples)})

    @property
    def has_samples(self) -> bool:
        """Whether any unit is a sampled run."""
        return any(r.samples for r in self.runs)

    def complete_runs(self, models: Iterable[str] | None = None) -> list[WorkflowRun]:
        """The runs that every one of ``models`` (default: all) has finished."""
        want = set(self.models if models is None else models)
        return [r for r in self.runs if want <= r.models.keys()]


Record = Header | Unit
_decoder = msgspec.json.Decoder(Record)
_encoder = msgspec.json.Encoder()


def unit_key(problem_id: str, workflow: str, model: str, sample: int | None = None) -> str:
    """The key of one unit: its greedy run (``sample`` None) or its k-th sampled run."""
    key = f"{problem_id}|{workflow}|{model}"
    return key if sample is None else f"{key}|{sample}"


SEED_RANGE: Final = 2**31
"""Seeds sent to the engine lie in [0, 2**31)."""


def sample_seed(seed: int, problem_id: str, workflow: str, model: str, sample: int) -> int:
    """The seed of one sampled run: the first 31 bits of sha256 over the build's ``seed``,
    the problem, the workflow, the model and the sample index (distinct per run, the same
    in every process)."""
    digest = hashlib.sha256(f"{seed}|{problem_id}|{workflow}|{model}|{sample}".encode())
    return int.from_bytes(digest.digest()[:4], "big") % SEED_RANGE


def stage_seed(run_seed: int, stage: int) -> int:
    """The seed a sampled run's stage ``stage`` sends: ``(run_seed + stage) mod 2**31``."""
    return (run_seed + stage) % SEED_RANGE


def check_unit(u: Unit, workflows: dict[str, list[str]]) -> None:
    """Cross-field checks msgspec cannot express; raise ValueError naming the field."""
    if u.key != unit_key(u.problem_id, u.workflow, u.model, u.sample):
        raise ValueError(f"`key` {u.key!r} is not problem_id|workflow|model"
                         + ("" if u.sample is None else "|sample"))
    if (u.sample is None) != (u.seed is None):
        raise ValueError("`seed` is set exactly when `sample` is (a sampled run's seed)")
    if u.workflow not in workflows:
        raise ValueError(f"`workflow` {u.workflow!r} is not in the header's workflows "
                         f"{sorted(workflows)}")
    roles = [s.role for s in u.stages]
    if roles != workflows[u.workflow]:
        raise ValueError(f"`stages` roles {roles} differ from workflow {u.workflow!r}: "
                         f"{workflows[u.workflow]}")
    for i, s in enumerate(u.stages):
        if s.index != i:
            raise ValueError(f"`stages[{i}].index` is {s.index}, expected {i}")
        if not s.messages:
            raise ValueError(f"`stages[{i}].messages` is empty")
    total = sum(s.output_tokens for s in u.stages)
    if u.total_output_tokens != total:
        raise ValueError(f"`total_output_tokens` is {u.total_output_tokens}, the stages sum "
                         f"to {total}")


def encode(record: msgspec.Struct) -> bytes:
    """One JSON line (with its newline) of a record (this format's or another)."""
    return _encoder.encode(record) + b"\n"


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of a ``.jsonl`` or ``.jsonl.gz`` file. Every record ends
    with a newline, so text after the last one (a build killed mid-write) is skipped."""
    text = _read_text(Path(path))
    text = text[: text.rfind(b"\n") + 1]
    for n, line in enumerate(text.split(b"\n"), start=1):
        if line.strip():
            yield n, line


def read_records(path: str | os.PathLike[str]) -> tuple[Header, list[Unit]]:
    """The validated header and units of a trace file, in file order."""
    path = Path(path)
    header: Header | None = None
    units: list[Unit] = []
    seen: dict[str, int] = {}
    for n, line in iter_lines(path):
        where = f"{path}: line {n}"
        if header is None:
            _check_version(line, where)
        try:
            rec = _decoder.decode(line)
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as e:
            raise TraceFormatError(f"{where}{_key_hint(line)}: {e}") from None
        if header is None:
            if not isinstance(rec, Header):
                raise TraceFormatError(f"{where}: the first record must be the header "
                                       f"(kind \"header\"), found kind \"unit\"")
            header = rec
            continue
        if isinstance(rec, Header):
            raise TraceFormatError(f"{where}: a second header (only line 1 may be one)")
        try:
            check_unit(rec, header.workflows)
        except ValueError as e:
            raise TraceFormatError(f"{where} (unit {rec.key}): {e}") from None
        if rec.key in seen:
            raise TraceFormatError(f"{where} (unit {rec.key}): duplicate key, first on "
                                   f"line {seen[rec.key]}")
        seen[rec.key] = n
        units.append(rec)
    if header is None:
        raise TraceFormatError(f"{path}: empty trace (no header line)")
    return header, units


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load and validate a trace; units are grouped per (problem, workflow) in file order."""
    header, units = read_records(path)
    runs: dict[tuple[str, str], WorkflowRun] = {}
    for u in units:
        run = runs.get((u.problem_id, u.workflow))
        if run is None:
            run = runs[(u.problem_id, u.workflow)] = WorkflowRun(
                u.problem_id, u.workflow, header.workflows[u.workflow], u.user_prompt,
                u.reference, {})
        elif (u.user_prompt, u.reference) != (run.user_prompt, run.reference):
            raise TraceFormatError(f"{path} (unit {u.key}): user_prompt or reference differs "
                                   f"from another model's run of the same problem")
        mr = ModelRun(u.model, u.stages, u.final_answer, u.correct, u.score,
                      u.total_output_tokens, u.latency_s, u.detail, u.sample)
        if u.sample is None:
            run.models[u.model] = mr
        else:
            run.samples.setdefault(u.model, []).append(mr)
    for run in runs.values():
        for mine in run.samples.values():
            mine.sort(key=lambda r: r.sample or 0)
    return Trace(header, list(runs.values()))


class TraceWriter:
    """Appends records to a trace file durably: one flushed and fsynced write per record
    (one gzip member per record for ``.gz``), so a kill loses at most the unit in flight."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.gz = self.path.suffix == ".gz"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        self._f = self.path.open("ab")

    def append(self, record: msgspec.Struct) -> None:
        data = encode(record)
        self._f.write(gzip.compress(data, mtime=0) if self.gz else data)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _repair_tail(self) -> None:
        """Cut a torn last record (or gzip member) so appends start on a clean boundary."""
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        good = _good_prefix(raw, self.gz)
        if good < len(raw):
            with self.path.open("r+b") as f:
                f.truncate(good)


def write_records(dst: str | os.PathLike[str], header: Header, units: list[Unit]) -> None:
    """Write a whole trace atomically (``.gz``: one gzip member), units in the given order."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    body = encode(header) + b"".join(encode(u) for u in units)
    tmp.write_bytes(gzip.compress(body, compresslevel=9, mtime=0)
                    if dst.suffix == ".gz" else body)
    tmp.replace(dst)


def compact(src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
            dst: str | os.PathLike[str], without: str | os.PathLike[str] | None = None,
            workflows: Sequence[str] | None = None) -> int:
    """Rewrite a trace as one gzip member (better compression), units sorted by key;
    return the number of units. Several ``src`` are merged (``merge``). ``without``: a
    trace whose problems are left out (what a grown file adds to it). ``workflows``: keep
    only these (the header names only them; a name the header lacks is a
    ``TraceFormatError``). ``dst`` is written atomically."""
    srcs = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    names = [str(f) for f in srcs]
    header, units = merge([read_records(f) for f in srcs], names)
    if without is not None:
        old = {u.problem_id for u in read_records(without)[1]}
        units = [u for u in units if u.problem_id not in old]
    if workflows is not None:
        unknown = sorted(set(workflows) - set(header.workflows))
        if unknown:
            raise TraceFormatError(f"{', '.join(names)}: no workflow "
                                   f"{', '.join(unknown)} (it has "
                                   f"{', '.join(sorted(header.workflows))})")
        header = msgspec.structs.replace(
            header, workflows={w: r for w, r in header.workflows.items() if w in workflows})
        units = [u for u in units if u.workflow in header.workflows]
    write_records(dst, header, sorted(units, key=lambda u: u.key))
    return len(units)


def unite_workflows(headers: Sequence[Header], names: Sequence[str]
                    ) -> dict[str, list[str]]:
    """Every workflow of ``headers`` with its roles; ``TraceFormatError`` naming the file
    (``names``, in order) when a workflow's roles differ between two of them."""
    flows: dict[str, list[str]] = {}
    for h, name in zip(headers, names):
        for w, roles in h.workflows.items():
            if flows.setdefault(w, roles) != roles:
                raise TraceFormatError(f"{name}: workflow {w!r} has roles {roles}, "
                                       f"{flows[w]} elsewhere")
    return flows


def merge(traces: Sequence[tuple[Header, list[Unit]]],
          names: Sequence[str]) -> tuple[Header, list[Unit]]:
    """One trace of several made with the same settings (e.g. the shipped file and the
    new problems cut from a grown copy): their headers must agree but for the workflows
    (united; a workflow's roles must agree), and a unit key two of them hold must hold
    the same unit. Anything else is a ``TraceFormatError`` naming the files."""
    header, _ = traces[0]
    flows = unite_workflows([h for h, _ in traces], names)
    units: dict[str, Unit] = {}
    for (h, us), name in zip(traces, names):
        if msgspec.structs.replace(h, workflows={}) != \
                msgspec.structs.replace(header, workflows={}):
            raise TraceFormatError(f"{name}: its header (suite, settings, sources or "
                                   f"command) differs from {names[0]}'s: not merged")
        for u in us:
            if units.setdefault(u.key, u) != u:
                raise TraceFormatError(f"{name}: unit {u.key!r} differs from another "
                                       f"file's")
    return msgspec.structs.replace(header, workflows=flows), list(units.values())


def _read_text(path: Path) -> bytes:
    raw = path.read_bytes()
    if path.suffix != ".gz":
        return raw
    out = io.BytesIO()
    for member in _members(raw):
        out.write(member)
    return out.getvalue()


def _members(raw: bytes) -> Iterator[bytes]:
    """Decompressed gzip members; a truncated last member yields its readable part."""
    pos = 0
    while pos < len(raw):
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            data = d.decompress(raw[pos:])
        except zlib.error as e:
            raise TraceFormatError(f"corrupt gzip data at byte {pos}: {e}") from None
        yield data
        if not d.eof:
            return
        pos = len(raw) - len(d.unused_data)


def _good_prefix(raw: bytes, gz: bool) -> int:
    """Length of the longest prefix of ``raw`` made of whole records."""
    if not gz:
        return raw.rfind(b"\n") + 1
    pos = 0
    while pos < len(raw):
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            d.decompress(raw[pos:])
        except zlib.error:
            return pos
        if not d.eof:
            return pos
        pos = len(raw) - len(d.unused_data)
    return pos


def _check_version(line: bytes, where: str) -> None:
    """Refuse another format or version before the strict decode (whose fields may differ)."""
    try:
        rec = msgspec.json.decode(line)
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        return  # the strict decode reports it
    if not isinstance(rec, dict) or rec.get("kind") != "header":
        return
    if rec.get("format") != FORMAT:
        raise TraceFormatError(f"{where}: not a trace (format {rec.get('format')!r}, "
                               f"expected {FORMAT!r})")
    if rec.get("version") != VERSION:
        raise TraceFormatError(f"{where}: trace format version {rec.get('version')}; this "
                               f"code reads version {VERSION}")


def _key_hint(line: bytes) -> str:
    try:
        key = msgspec.json.decode(line).get("key")
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError, AttributeError):
        return ""
    return f" (unit {key})" if isinstance(key, str) else ""
