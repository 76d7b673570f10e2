"""Tool gaps: the time an agent spends between two calls of a program (a tool's run, its
own work), from a named distribution or from the trace.

``--tool-gap`` takes ``NAME[:P1[,P2]]``:

- ``none`` (default): the next stage is sent when the previous one ends (no gap);
- ``fixed:S``: S seconds after every non-final stage;
- ``exp:MEAN``: exponential, mean MEAN seconds;
- ``uniform:LO,HI``: uniform on [LO, HI] seconds;
- ``lognormal:MEDIAN,SIGMA``: log-normal with median MEDIAN seconds and log-space standard
  deviation SIGMA;
- ``trace``: the gap the trace recorded after the stage (``Stage.tool_gap_s``) in the run of
  the model that served it.

A drawn gap depends only on the seed and the call's place (job, attempt, stage), not on
the order in which calls end, so every policy of a replay waits the same gaps. No gap
follows a final stage (nor an attempt's last stage before a retry).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from router.trace_format import WorkflowRun

DISTRIBUTIONS = {"none": 0, "fixed": 1, "exp": 1, "uniform": 2, "lognormal": 2, "trace": 0}
"""Distribution name -> number of parameters."""
MAX_GAP_S = 3600.0
"""The longest gap a parameter may ask for (seconds)."""


@dataclass(frozen=True)
class ToolGaps:
    """A tool-gap setting (``--tool-gap``): the distribution, its parameters, the seed."""

    name: str = "none"
    params: tuple[float, ...] = ()
    seed: int = 0

    @property
    def on(self) -> bool:
        return self.name != "none"

    def label(self) -> str:
        """The setting as given: ``exp:5``."""
        return self.name + (":" + ",".join(f"{p:g}" for p in self.params) if self.params
                            else "")

    def draw(self, job_id: str, attempt: int, stage: int) -> float:
        """The gap after ``stage`` of ``attempt`` of job ``job_id`` (a drawn distribution;
        0 when off; ``trace``: see ``after``)."""
        if self.name in ("none", "trace"):
            return 0.0
        key = f"{self.seed}|{job_id}|{attempt}|{stage}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        a = self.params[0]
        if self.name == "fixed":
            return a
        if self.name == "exp":
            return rng.expovariate(1.0 / a) if a > 0 else 0.0
        if self.name == "uniform":
            return rng.uniform(a, self.params[1])
        return min(MAX_GAP_S, a * math.exp(self.params[1] * rng.gauss(0.0, 1.0)))

    def after(self, job_id: str, run: WorkflowRun, attempt: int, stage: int,
              model: str) -> float:
        """The gap after ``stage`` served by trace model ``model``."""
        if self.name == "trace":
            return recorded(run, model, stage)
        return self.draw(job_id, attempt, stage)

    def expected(self, job_id: str, run: WorkflowRun, attempt: int, stage: int,
                 models: Mapping[str, str]) -> float:
        """What the client tells the router of the gap after ``stage`` before it knows the
        serving model: the drawn gap, or (``trace``) the mean of the gaps the mapped trace
        models recorded."""
        if self.name != "trace":
            return self.draw(job_id, attempt, stage)
        gaps = [recorded(run, m, stage) for m in dict.fromkeys(models.values())]
        return sum(gaps) / len(gaps)


def recorded(run: WorkflowRun, model: str, stage: int) -> float:
    """The trace's gap after ``stage`` of ``model``'s run; ValueError when it has none."""
    gap = run.models[model].stages[stage].tool_gap_s
    if gap is None:
        raise ValueError(f"--tool-gap trace: problem {run.problem_id!r} ({model}, stage "
                         f"{stage}) records no tool_gap_s")
    return gap


def parse_tool_gap(text: str, seed: int = 0) -> ToolGaps:
    """``exp:5`` -> ``ToolGaps("exp", (5.0,), seed)``; ValueError on a bad setting."""
    name, _, rest = text.strip().partition(":")
    if name not in DISTRIBUTIONS:
        raise ValueError(f"--tool-gap {text!r}: unknown distribution {name!r}; use one of "
                         + ", ".join(DISTRIBUTIONS))
    try:
        params = tuple(float(p) for p in rest.split(",")) if rest else ()
    except ValueError:
        raise ValueError(f"--tool-gap {text!r}: parameters must be numbers") from None
    if len(params) != DISTRIBUTIONS[name]:
        raise ValueError(f"--tool-gap {text!r}: {name} takes {DISTRIBUTIONS[name]} "
                         "parameter(s), e.g. exp:5, uniform:2,8, lognormal:5,1")
    if not all(math.isfinite(p) and 0 <= p <= MAX_GAP_S for p in params):
        raise ValueError(f"--tool-gap {text!r}: parameters must be in [0, {MAX_GAP_S:g}]")
    if name == "uniform" and params[0] > params[1]:
        raise ValueError(f"--tool-gap {text!r}: uniform needs LO <= HI")
    return ToolGaps(name, params, seed)


def check_trace_gaps(gaps: ToolGaps, runs: list[WorkflowRun],
                     models: Mapping[str, str]) -> None:
    """With ``trace`` gaps: ValueError unless every non-final stage of every run of the
    mapped trace models records its gap."""
    if gaps.name != "trace":
        return
    for run in runs:
        for model in dict.fromkeys(models.values()):
            for stage in range(len(run.roles) - 1):
                recorded(run, model, stage)
