"""What a replay run records: one row per LLM call and one per workflow.

Times are seconds since the start of the run (the first arrival is at 0), measured by
the client: ``send_s`` when the request is sent, ``first_token_s`` when the first
streamed chunk arrives, ``end_s`` when the stream ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

R = TypeVar("R", "RequestRecord", "WorkflowRecord")


@dataclass
class RequestRecord:
    """One LLM call (a stage of one attempt of a workflow)."""

    job_id: str
    program_id: str
    attempt: int
    stage_index: int
    num_stages: int
    role: str
    send_s: float
    end_s: float
    first_token_s: float | None = None
    model: str = ""
    """Served model the router chose (empty if the call failed before routing)."""
    engine: str = ""
    trace_model: str = ""
    priority: int | None = None
    """Priority the router sent to the engine."""
    predicted_remaining_tokens: float | None = None
    forced_tokens: int = 0
    """``max_tokens`` for the chosen model: its output length in the trace."""
    output_tokens: int = 0
    """Tokens the engine generated (its usage report)."""
    prompt_tokens: int = 0
    """Prompt tokens as the engine counted them."""
    trace_prompt_tokens: int = 0
    """Prompt tokens of the same stage in the trace (the trace model's tokenizer)."""
    cached_tokens: int | None = None
    """Prompt tokens the engine found in its prefix cache (``usage.prompt_tokens_details.
    cached_tokens``; the twin: when first scheduled); None: not reported."""
    expected_return_s: float | None = None
    """The gap the client announced to the router (``workflow.expected_return_s``)."""
    tool_gap_s: float | None = None
    """The tool gap the client waited after this call (``--tool-gap``); None: none
    followed (a final stage, or gaps off)."""
    queue_s: float | None = None
    """Engine queue time: the engine's arrival of the call to its first scheduling (what
    the summary's ``queue_s.mean`` averages); None: not reported (a live engine's
    response carries none, only its counters)."""
    error: str | None = None


@dataclass
class WorkflowRecord:
    """One workflow: all its attempts (one unless retries are on)."""

    job_id: str
    problem_id: str
    workflow: str
    num_stages: int
    arrival_s: float
    end_s: float
    attempts: int = 0
    correct: bool = False
    score: float = 0.0
    """The trace's score of the last attempt."""
    expected_score: float | None = None
    """The last attempt's final model's mean score over its sampled runs of this
    workflow (None: the trace has no samples of it)."""
    output_tokens: int = 0
    """Over every call of every attempt."""
    ttca_s: float | None = None
    """Time to correct answer: arrival to the end of the first correct attempt."""
    final_models: list[str] = field(default_factory=list)
    """Served model of each attempt's final stage."""
    error: str | None = None


def from_row(cls: type[R], row: Mapping[str, Any]) -> R:
    """A record from a row of ``requests.jsonl`` / ``workflows.jsonl`` (the columns the
    output adds, such as policy, rate and repeat, left out)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in row.items() if k in names})
