"""The annotated execution trie (VineLM section 3.1).

A node is a prefix of model choices ``(l1, ..., lk)`` for the first k LLM invocations of
a template's longest run; the root is ``()``. Each node carries the expected cumulative
cost, latency and accuracy *if execution stopped there*. Along every path cost and
latency never decrease (each invocation adds a non-negative amount) and accuracy never
decreases (a success marks its whole subtree), which is what makes the controller's
pruning exact; ``check_monotone`` verifies it and ``enforce_monotone`` restores it
(a running maximum from the root) after estimation noise.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from router.vinelm.template import Invocation, WorkflowTemplate

Path_ = tuple[str, ...]
FORMAT = "hetserve-vinelm-trie"
VERSION = 1


class ProfileError(ValueError):
    """A trie file that cannot be used (unreadable, wrong format, another template)."""


@dataclass(frozen=True)
class Annotation:
    cost: float
    """Expected cumulative cost of the prefix's invocations."""
    latency_s: float
    """Expected cumulative latency of the prefix's invocations."""
    accuracy: float
    """Probability that the answer is right if execution stops after the prefix."""
    samples: int = 0
    """Profiled executions of this node itself (0: estimated from others)."""


ROOT = Annotation(0.0, 0.0, 0.0)


def prefixes(invocations: Sequence[Invocation]) -> Iterator[Path_]:
    """Every non-root node, depth first, children in admissible-model order."""
    def walk(prefix: Path_) -> Iterator[Path_]:
        if len(prefix) == len(invocations):
            return
        for m in invocations[len(prefix)].models:
            child = prefix + (m,)
            yield child
            yield from walk(child)
    return walk(())


class Trie:
    """An annotated trie over one template's invocations."""

    def __init__(self, workflow: str, invocations: Sequence[Invocation],
                 nodes: Mapping[Path_, Annotation]) -> None:
        self.workflow = workflow
        self.invocations = list(invocations)
        self.nodes: dict[Path_, Annotation] = {(): ROOT, **nodes}
        missing = [p for p in prefixes(self.invocations) if p not in self.nodes]
        if missing:
            raise ValueError(f"trie of {workflow!r}: no annotation for {len(missing)} "
                             f"node(s), e.g. {list(missing[0])}")

    @property
    def depth(self) -> int:
        return len(self.invocations)

    def __getitem__(self, prefix: Path_) -> Annotation:
        return self.nodes[prefix]

    def children(self, prefix: Path_) -> list[Path_]:
        if len(prefix) >= self.depth:
            return []
        return [prefix + (m,) for m in self.invocations[len(prefix)].models]

    def leaves(self) -> list[Path_]:
        return [p for p in self.nodes if len(p) == self.depth]

    def is_node(self, prefix: Path_) -> bool:
        return prefix in self.nodes

    def violations(self, tol: float = 1e-12) -> list[tuple[Path_, str]]:
        """(node, field) pairs where a child is below its parent."""
        bad = []
        for p in prefixes(self.invocations):
            a, b = self.nodes[p[:-1]], self.nodes[p]
            for f in ("cost", "latency_s", "accuracy"):
                if getattr(b, f) < getattr(a, f) - tol:
                    bad.append((p, f))
        return bad

    def check_monotone(self) -> None:
        bad = self.violations()
        if bad:
            p, f = bad[0]
            raise ValueError(f"trie of {self.workflow!r} is not monotone: {f} of {list(p)} "
                             f"is below its parent's ({len(bad)} violation(s))")

    def enforce_monotone(self) -> Trie:
        """A copy in which every value is at least its parent's (running maximum)."""
        out: dict[Path_, Annotation] = {}
        for p in prefixes(self.invocations):
            a, b = out.get(p[:-1], ROOT), self.nodes[p]
            out[p] = replace(b, cost=max(a.cost, b.cost), latency_s=max(a.latency_s, b.latency_s),
                             accuracy=max(a.accuracy, b.accuracy))
        return Trie(self.workflow, self.invocations, out)

    # ---- files

    def to_json(self, template: WorkflowTemplate, info: Mapping[str, Any]) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "workflow": self.workflow,
                "signature": template.signature(), "info": dict(info),
                "nodes": [{"path": list(p), "cost": a.cost, "latency_s": a.latency_s,
                           "accuracy": a.accuracy, "samples": a.samples}
                          for p, a in self.nodes.items() if p]}


def save_tries(path: str | os.PathLike[str], tries: Mapping[str, dict[str, Any]]) -> None:
    """Write ``{workflow: Trie.to_json(...)}`` as one JSON file."""
    Path(path).write_text(json.dumps({"format": FORMAT, "version": VERSION,
                                      "workflows": dict(tries)}, indent=1) + "\n")


def load_tries(path: str | os.PathLike[str],
               templates: Mapping[str, WorkflowTemplate]) -> dict[str, Trie]:
    """The tries of ``templates`` from a profile file; ProfileError naming what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"VineLM profile {str(path)!r}: cannot read: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or \
            data.get("version") != VERSION:
        raise ProfileError(f"VineLM profile {str(path)!r}: not a {FORMAT} v{VERSION} file")
    out = {}
    for name, t in templates.items():
        entry = data.get("workflows", {}).get(name)
        if entry is None:
            raise ProfileError(f"VineLM profile {str(path)!r} has no trie for workflow "
                               f"{name!r}; profile it (python -m kernels_bench vinelm profile)")
        if entry.get("signature") != t.signature():
            raise ProfileError(f"VineLM profile {str(path)!r}: the trie of {name!r} was "
                               "profiled for another template (stages or models differ); "
                               "profile it again")
        try:
            nodes = {tuple(n["path"]): Annotation(float(n["cost"]), float(n["latency_s"]),
                                                  float(n["accuracy"]), int(n["samples"]))
                     for n in entry["nodes"]}
            trie = Trie(name, t.invocations(), nodes)
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"VineLM profile {str(path)!r}: workflow {name!r}: bad "
                               f"node list: {e}") from None
        try:
            trie.check_monotone()
        except ValueError as e:
            raise ProfileError(f"VineLM profile {str(path)!r}: {e}") from None
        out[name] = trie
    return out
