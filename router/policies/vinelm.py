"""``vinelm``: VineLM's per-invocation model choice over an annotated execution trie.

A request whose workflow metadata carries an ``objective`` (``router.vinelm.objective``)
and names a configured workflow template is placed by the controller: the trie of its
workflow is re-rooted at the models chosen for the program's earlier calls, the
subtrie is searched under the objective with the realised elapsed time
(``router.vinelm.search``), and the first model of the best path serves this call.
Load-aware adjustment: each model's current expected delay, the smallest over its
candidate engines of

    D_e = decode_tokens_e x decode_ms_per_token[m] / max_batch_size[m] / 1000   (s)

(the engine's queued decode work at its full-batch decode rate; Chimera's L[m] per
engine), is added to the remaining latency of every path that uses the model. The
engine within the model is chosen by the ``picker`` setting's engine picker (default
``lmetric``). Requests without an objective go to
the ``fallback`` policy (default ``chimera``: one model per program).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import BuildPolicy, PickerPolicy, decision, of_model
from router.policies.pickers import PickerName
from router.settings import (STRICT, Count, Fraction, NonNegative, Positive, PositiveInt,
                             SettingsError, check)
from router.state.view import EngineView, StateView
from router.types import Decision, NoEngineAvailable, RoutingRequest
from router.vinelm.controller import Controller, NoAdmissibleModel
from router.vinelm.estimate import build_trie, cascade_accuracy
from router.vinelm.template import TemplateError, WorkflowTemplate, parse_templates
from router.vinelm.trie import Trie, load_tries, prefixes


@pydantic_dataclass(frozen=True, config=STRICT)
class VineLMSettings:
    workflows: dict[str, Any] = field(default_factory=dict)
    """Workflow templates by name (``router.vinelm.template``)."""
    profile_path: str = ""
    """The annotated tries (``python -m kernels_bench vinelm profile``); relative to the
    cluster file."""
    static_prior: bool = False
    """Annotate the tries from the three tables below instead of a profile."""
    success: dict[str, Fraction] = field(default_factory=dict)
    """Static conditional success c of an answering invocation per model: the cascade
    decomposition mu = mu_parent + (1 - mu_parent) x c."""
    cost_per_call: dict[str, NonNegative] = field(default_factory=dict)
    latency_s_per_call: dict[str, NonNegative] = field(default_factory=dict)
    prompt_cost_per_1k: dict[str, NonNegative] = field(default_factory=dict)
    """Cost per 1000 prompt tokens per model (profiling's cost of an invocation)."""
    output_cost_per_1k: dict[str, NonNegative] = field(default_factory=dict)
    """Cost per 1000 output tokens per model."""
    load_aware: bool = True
    """Add each model's expected engine delay D_e to the paths that use it."""
    decode_ms_per_token: dict[str, Positive] = field(default_factory=dict)
    """Static decode profile for D_e when no profile predictor is configured."""
    max_batch_size: dict[str, PositiveInt] = field(default_factory=dict)
    fallback: str = "chimera"
    """Policy for requests that carry no objective."""
    program_ttl_s: Positive = 600.0
    """A program with no call for this long leaves the controller."""
    cascades_per_problem: PositiveInt = 1
    """Sampling budget of cascade profiling: cascades per profiled problem."""
    smooth_rank: PositiveInt = 1
    """Rank of the smoothing of the deepest conditional estimates (VineLM: rank-1)."""
    smooth_depths: Count = 1
    """Deepest trie depths whose conditional estimates are smoothed (0: none)."""
    smooth_strength: NonNegative = 5.0
    """Pull of a sparsely seen parent's row towards the common row in the smoothing fit,
    in pseudo-executions (``router.vinelm.estimate.low_rank_fit``; chosen here: the
    paper's regularisation could not be checked)."""
    seed: Count = 0
    """Seed of cascade sampling's random model choices."""
    reroot: bool = True
    """Re-root the trie at the realised prefix and elapsed time at every call (VineLM
    section 4); false, the ablation: a program follows the plan of its first call."""
    picker: PickerName = "lmetric"
    """The engine picker that chooses among the chosen model's engines
    (``router.policies.pickers``; docs/policies.md)."""

    def __post_init__(self) -> None:
        try:
            templates = parse_templates(self.workflows)
        except TemplateError as e:
            raise SettingsError(e.key, e.message) from None
        check("fallback", self.fallback != "vinelm", "must be another policy")
        if self.static_prior:
            models = sorted({m for t in templates.values() for m in t.models()})
            for key in ("success", "cost_per_call", "latency_s_per_call"):
                missing = [m for m in models if m not in getattr(self, key)]
                if missing:
                    raise SettingsError(key, f"static_prior = true but no value for "
                                       f"{', '.join(missing)}")


def static_trie(template: WorkflowTemplate, s: VineLMSettings) -> Trie:
    """A trie annotated from the static tables (cascade decomposition per invocation)."""
    invs = template.invocations()
    mu: dict[tuple[str, ...], float] = {(): 0.0}
    cost, lat = {}, {}
    for p in prefixes(invs):
        c = s.success[p[-1]] if invs[len(p) - 1].answers else 0.0
        mu[p] = cascade_accuracy(mu[p[:-1]], c)
        cost[p], lat[p] = s.cost_per_call[p[-1]], s.latency_s_per_call[p[-1]]
    del mu[()]
    return build_trie(template.name, invs, mu, cost, lat, {})


def engine_delay_s(decode_tokens: float, decode_ms_per_token: float,
                   max_batch_size: int) -> float:
    """D_e = decode_tokens_e x decode_ms_per_token[m] / max_batch_size[m] / 1000."""
    return decode_tokens * decode_ms_per_token / max_batch_size / 1000.0


class VineLM(PickerPolicy[VineLMSettings]):
    name = "vinelm"
    program_affinity = True
    Settings = VineLMSettings
    inputs = frozenset({"decode_tokens"})
    default_picker = "lmetric"

    def __init__(self, settings: VineLMSettings, cluster: Any, predictors: Any,
                 build: BuildPolicy) -> None:
        super().__init__(settings, cluster, predictors, build)
        s = settings
        self.templates = parse_templates(s.workflows)
        if not self.templates:
            raise ValueError("policy 'vinelm' needs workflow templates: add "
                             "[router.policies.vinelm.workflows.<name>] tables")
        served = set(cluster.models)
        for name, t in self.templates.items():
            unknown = [m for m in t.models() if m not in served]
            if unknown:
                raise ValueError(f"router.policies.vinelm.workflows.{name}: models "
                                 f"{', '.join(unknown)} are not served by any engine")
        if s.profile_path:
            self.tries = load_tries(s.profile_path, self.templates)
            self.sources["trie"] = "profile"
        elif s.static_prior:
            self.tries = {n: static_trie(t, s) for n, t in self.templates.items()}
            self.sources["trie"] = "static_prior"
        else:
            raise ValueError("policy 'vinelm' needs annotated tries: profile the workflows "
                             "(python -m kernels_bench vinelm profile) and set "
                             "router.policies.vinelm.profile_path, or set static_prior = true "
                             "with the success, cost_per_call and latency_s_per_call tables")
        self.decode_ms: dict[str, float] = {}
        self.max_batch: dict[str, int] = {}
        if s.load_aware:
            profiles = getattr(predictors, "profiles", None) or {}
            for m in sorted({m for t in self.templates.values() for m in t.models()}):
                if m in profiles:
                    self.decode_ms[m] = profiles[m].decode_ms_per_token
                    self.max_batch[m] = profiles[m].max_batch_size
                elif m in s.decode_ms_per_token and m in s.max_batch_size:
                    self.decode_ms[m], self.max_batch[m] = (s.decode_ms_per_token[m],
                                                            s.max_batch_size[m])
                else:
                    raise ValueError(
                        f"policy 'vinelm' (load_aware = true) needs the decode profile of "
                        f"{m}: profile the engines (python -m kernels_bench profile) and set "
                        "router.predictors.profiles, or give router.policies.vinelm."
                        "decode_ms_per_token and max_batch_size, or set load_aware = false")
        self.controller = Controller(self.tries, s.program_ttl_s, s.reroot)
        try:
            self.fallback = build(s.fallback)
        except ValueError as e:
            raise ValueError(f"router.policies.vinelm.fallback: {e}") from None
        if self.fallback.window is not None:
            raise ValueError(f"router.policies.vinelm.fallback: {s.fallback!r} batches "
                             "requests; choose a per-request policy")

    def _controlled(self, req: RoutingRequest) -> bool:
        return req.workflow.objective is not None

    async def predict(self, reqs: Sequence[RoutingRequest]) -> list[Any]:
        idx = [i for i, r in enumerate(reqs) if not self._controlled(r)]
        out: list[Any] = [None] * len(reqs)
        if idx:
            for i, p in zip(idx, await self.fallback.predict([reqs[i] for i in idx])):
                out[i] = p
        return out

    def delays(self, cands: Sequence[EngineView]) -> dict[str, float]:
        """Per model, the smallest D_e over its candidate engines."""
        out: dict[str, float] = {}
        for e in cands:
            if e.model in self.decode_ms:
                d = engine_delay_s(e.decode_tokens, self.decode_ms[e.model],
                                   self.max_batch[e.model])
                out[e.model] = min(d, out.get(e.model, d))
        return out

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        if not self._controlled(req):
            return self.fallback.decide(req, cands, view, pred)
        w = req.workflow
        if w.workflow is None:
            raise ValueError("'workflow.objective' needs 'workflow.workflow' (the template's "
                             f"name: {', '.join(sorted(self.tries))})")
        delays = self.delays(cands) if self.settings.load_aware else {}
        try:
            depth, plan = self.controller.plan(
                w.program_id, w.workflow, w.stage, w.stage_index, w.attempt, w.num_stages,
                req.arrival_time, w.objective, delays, {e.model for e in cands})
        except NoAdmissibleModel as exc:
            raise NoEngineAvailable(str(exc)) from None
        model = plan.path[depth]
        self.controller.chosen(w.program_id, w.workflow, depth, model, req.arrival_time, plan)
        if w.is_final:
            self.controller.finished(w.program_id)
        pick = self.picker.pick(req, of_model(cands, model), view)
        return decision(req, pick.engine, self.name, info={
            "depth": depth, "plan": list(plan.path), "feasible": plan.feasible,
            "expected_accuracy": plan.accuracy, "expected_cost": plan.cost,
            "expected_latency_s": plan.latency_s, "delay_s": delays.get(model, 0.0),
            **pick.info})
