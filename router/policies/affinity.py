"""Engine affinity with a load guardrail: a program's call goes back to the engine its last
call went to (that engine holds the program's prefix in its KV cache), unless that engine
is overloaded.

The policy decides first (model and engine); then, if the program's last engine serves
the chosen model and is a candidate, the call goes there instead, unless

    load_home - load_min > abs_threshold  and  load_home > rel_threshold x load_min

with ``load`` an engine's running plus waiting requests (``EngineView.requests``) and
``load_min`` the least loaded candidate of the model: SGLang's cache-aware router's
balance rule (``[router] affinity_abs_threshold``, ``affinity_rel_threshold``). Then the
policy's own engine stands, and its cost model weighs the prefix the program gives up
(LMETRIC's new prefill tokens ``P - C_i``), and the move is counted
(``hetserve_program_moves{reason="guardrail"}``).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


def overloaded(load: int, least: int, abs_threshold: int, rel_threshold: float) -> bool:
    """Whether an engine of ``load`` requests is too busy to keep a program, beside a
    candidate of ``least`` (the formula above)."""
    return load - least > abs_threshold and load > rel_threshold * least


def keep_home(req: RoutingRequest, dec: Decision, cands: Sequence[EngineView],
              view: StateView, abs_threshold: int, rel_threshold: float) -> Decision:
    """``dec`` sent to the program's last engine when it serves the decided model, is a
    candidate and is not ``overloaded``; else ``dec`` (its ``info["affinity"]`` says
    ``guardrail`` when the guardrail moved the program)."""
    home = view.program_engine(req.workflow.program_id)
    if home is None or home == dec.instance:
        return dec
    mine = [e for e in cands if e.model == dec.model]
    engine = next((e for e in mine if e.name == home), None)
    if engine is None:
        return dec
    if overloaded(engine.requests, min(e.requests for e in mine), abs_threshold,
                  rel_threshold):
        return dataclasses.replace(dec, info={**dec.info, "affinity": "guardrail"})
    return dataclasses.replace(dec, instance=engine.name, url=engine.url,
                               info={**dec.info, "affinity": "kept"})
