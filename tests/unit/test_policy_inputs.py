"""``Policy.inputs`` and ``Picker.inputs``: each policy and each engine picker declares
exactly the engine state its source reads, docs/router.md shows the table the policies'
declarations make (with their default pickers) and docs/policies.md the pickers'.

The check is static (``ast``): from the policy or picker class, every definition it names
is followed through ``router/policies`` and ``router/vinelm`` (module-level functions,
classes and constants, ``from`` imports; a policy built by a constant name,
``build("lmetric")``, is followed to its class; a policy's engine picker, built by
``build.picker``, is not followed: it is checked as a part of its own, and not followed
into ``router/policies/pickers`` from a policy), and every attribute named like an input
on an object other than ``self`` (``e.requests``, ``view.cached_tokens(...)``) is a read.
It over-approximates (every method of a named class counts, a same-named attribute of
another object counts: RouteBalance's dead-reckoned ``local[e].batch_size``, which it
reads from the engine view too) and is blind to what it cannot name. Those sites are
explicit here: ``getattr`` with a computed name, ``attrgetter``, ``vars``, ``__dict__``,
``_asdict`` and ``build`` of a computed policy name each stop the test unless listed in
``OPAQUE`` with the reason they read no engine state. Not seen at all: an ``EngineView``
read as a tuple (``e[4]``, unpacking); no policy does that.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from router.policies import POLICIES
from router.policies.inputs import (INPUTS, ON_STOCK_VLLM, inputs_table, policy_inputs,
                                    stock_inputs)
from router.policies.pickers import PICKERS
from router.state.view import EngineView, StateView

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("router.policies", "router.vinelm")
"""Where a policy's helpers live: the scan follows names into these packages only."""
PICKER_PACKAGE = "router.policies.pickers"
"""Where the engine pickers live: followed from a picker only."""
NOT_INPUTS = frozenset({"name", "model", "url", "up", "down_reason"})
"""``EngineView`` fields that are no engine state: identity, and health (every candidate
is up)."""
OPAQUE: dict[tuple[str, str, str], str] = {
    ("router.policies.routebalance", "request_weights", "getattr(default, k)"):
        "reads a field of the default Weights",
    ("router.policies.vinelm", "VineLMSettings", "getattr(self, key)"):
        "reads the settings' own static tables",
    ("router.vinelm.trie", "Trie", "getattr(a, f)"):
        "compares annotation fields (cost, latency_s, accuracy) of two trie nodes",
    ("router.vinelm.trie", "Trie", "getattr(b, f)"):
        "the same comparison's other side",
    ("router.policies.vinelm", "VineLM", "build(s.fallback)"):
        "the fallback decides requests without an objective; it reads its own inputs",
}
"""Sites the scan cannot follow (module, top-level definition, code) -> why no engine
state is read there."""
SECTION = "## What each policy reads, and what it estimates on stock vLLM"
PICKERS_SECTION = "## Engine pickers"


def module_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin).read_text(encoding="utf-8")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _ours(module: str, pickers: bool) -> bool:
    return any(_within(module, p) for p in PACKAGES) and (
        pickers or not _within(module, PICKER_PACKAGE))


@dataclass
class Reads:
    inputs: set[str] = field(default_factory=set)
    opaque: set[tuple[str, str, str]] = field(default_factory=set)


class Scan:
    """Engine inputs read by a definition and every definition it names, transitively."""

    def __init__(self, source: Callable[[str], str] = module_source,
                 policies: dict[str, tuple[str, str]] | None = None,
                 pickers: bool = False) -> None:
        """``pickers``: follow names into ``router.policies.pickers`` (scanning a picker)."""
        self.source, self.pickers = source, pickers
        self.policies = policies if policies is not None else {
            n: (p.__module__, p.__name__) for n, p in POLICIES.items()}
        self._modules: dict[str, tuple[dict[str, ast.AST], dict[str, tuple[str, str]]]] = {}

    def module(self, name: str) -> tuple[dict[str, ast.AST], dict[str, tuple[str, str]]]:
        """Top-level definitions, and names imported from the policy packages."""
        if name not in self._modules:
            tree = ast.parse(self.source(name))
            defs: dict[str, ast.AST] = {}
            imports: dict[str, tuple[str, str]] = {}
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defs[node.name] = node
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    defs.update((t.id, node) for t in targets if isinstance(t, ast.Name))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and \
                        _ours(node.module, self.pickers):
                    assert not node.level, f"{name}: relative import"
                    imports.update((a.asname or a.name, (node.module, a.name))
                                   for a in node.names)
                elif isinstance(node, ast.Import):
                    assert not any(_ours(a.name, True) for a in node.names), \
                        f"{name}: `import` of a policy module; the scan follows `from` imports"
            self._modules[name] = defs, imports
        return self._modules[name]

    def __call__(self, module: str, name: str) -> Reads:
        reads, todo = Reads(), [(module, name)]
        seen: set[tuple[str, str]] = set()
        while todo:
            mod, n = todo.pop()
            if (mod, n) in seen:
                continue
            seen.add((mod, n))
            defs, imports = self.module(mod)
            if n in imports:
                todo.append(imports[n])
            elif n in defs:
                todo.extend(self._visit(mod, n, defs[n], reads))
        return reads

    def _visit(self, mod: str, top: str, node: ast.AST, reads: Reads) -> list[tuple[str, str]]:
        """Record the reads of one definition; the definitions it names."""
        named: list[tuple[str, str]] = []
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                named.append((mod, sub.id))
                if sub.id in ("attrgetter", "vars"):
                    reads.opaque.add((mod, top, sub.id))
            elif isinstance(sub, ast.Attribute):
                if sub.attr in INPUTS and not (isinstance(sub.value, ast.Name)
                                               and sub.value.id == "self"):
                    reads.inputs.add(sub.attr)
                elif sub.attr in ("attrgetter", "__dict__", "_asdict"):
                    reads.opaque.add((mod, top, ast.unparse(sub)))
            elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) \
                    and sub.func.id in ("getattr", "build"):
                arg = sub.args[1 if sub.func.id == "getattr" else 0]
                const = arg.value if isinstance(arg, ast.Constant) else None
                if sub.func.id == "getattr" and isinstance(const, str):
                    reads.inputs.update({const} & INPUTS)
                elif sub.func.id == "build" and isinstance(const, str):
                    named.append(self.policies[const])
                else:
                    reads.opaque.add((mod, top, ast.unparse(sub)))
        return named


SCAN = Scan()
PICKER_SCAN = Scan(pickers=True)


def scan(name: str) -> Reads:
    policy = POLICIES[name]
    return SCAN(policy.__module__, policy.__name__)


def scan_picker(name: str) -> Reads:
    picker = PICKERS[name]
    return PICKER_SCAN(picker.__module__, picker.__name__)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_declaration_is_what_the_source_reads(name: str) -> None:
    reads = scan(name)
    unexplained = reads.opaque - set(OPAQUE)
    assert not unexplained, f"{name}: the scan cannot follow {sorted(unexplained)}; make " \
        "the read static, or add the site to OPAQUE saying why it reads no engine state"
    declared = POLICIES[name].inputs
    assert declared == reads.inputs, (
        f"{name}.inputs: undeclared reads {sorted(reads.inputs - declared)}, "
        f"declared but not read {sorted(declared - reads.inputs)}")


@pytest.mark.parametrize("name", sorted(PICKERS))
def test_a_pickers_declaration_is_what_its_source_reads(name: str) -> None:
    reads = scan_picker(name)
    assert not reads.opaque, f"picker {name}: the scan cannot follow {sorted(reads.opaque)}"
    declared = PICKERS[name].inputs
    assert declared == reads.inputs, (
        f"{name}.inputs: undeclared reads {sorted(reads.inputs - declared)}, "
        f"declared but not read {sorted(declared - reads.inputs)}")


def test_every_opaque_site_is_still_there() -> None:
    assert set().union(*(scan(n).opaque for n in POLICIES)) == set(OPAQUE)


def test_a_policy_reads_what_its_picker_reads() -> None:
    chimera = POLICIES["chimera"]
    assert policy_inputs(chimera) == chimera.inputs | PICKERS["lmetric"].inputs
    assert policy_inputs(chimera, {"picker": "least_kv"}) == {
        "model_inflight_tokens", "program_model", "kv_usage", "inflight_requests"}
    assert policy_inputs(POLICIES["dynamo"]) == POLICIES["dynamo"].inputs


def test_the_scan_follows_helpers_and_sub_policies() -> None:
    modules = {
        "router.policies.p": "from router.policies.h import helper\n"
                             "class P:\n"
                             "    def decide(self, e, view, build):\n"
                             "        self.batch_size = build('q')\n"
                             "        return helper(e) + getattr(e, 'kv_usage')\n",
        "router.policies.h": "def helper(e):\n    return e.requests\n"
                             "def unused(e):\n    return e.waiting\n",
        "router.policies.q": "class Q:\n"
                             "    def decide(self, req, e, view, build):\n"
                             "        return view.cached_tokens(req, e.name), build(e.model)\n",
    }
    reads = Scan(modules.__getitem__, {"q": ("router.policies.q", "Q")})("router.policies.p", "P")
    assert reads.inputs == {"requests", "kv_usage", "cached_tokens"}
    assert reads.opaque == {("router.policies.q", "Q", "build(e.model)")}


def test_the_scan_leaves_pickers_to_their_own_check() -> None:
    modules = {
        "router.policies.p": "from router.policies.pickers.k import K\n"
                             "class P:\n"
                             "    Settings = K\n"
                             "    def decide(self, e, build):\n"
                             "        return build.picker('k'), e.batch_size\n",
        "router.policies.pickers.k": "class K:\n    def pick(self, e):\n"
                                     "        return e.kv_usage\n",
    }
    assert Scan(modules.__getitem__, {})("router.policies.p", "P").inputs == {"batch_size"}
    assert Scan(modules.__getitem__, {}, pickers=True)(
        "router.policies.p", "P").inputs == {"batch_size", "kv_usage"}


@pytest.mark.parametrize("inputs", [*(p.inputs for p in POLICIES.values()),
                                    *(p.inputs for p in PICKERS.values())])
def test_every_declared_input_has_a_source_on_stock_vllm(inputs: frozenset[str]) -> None:
    assert inputs <= set(ON_STOCK_VLLM)


def test_the_inputs_are_the_views_engine_state() -> None:
    properties = {n for n, v in vars(EngineView).items() if isinstance(v, property)}
    methods = {n for n, v in vars(StateView).items() if callable(v) and not n.startswith("_")}
    assert INPUTS == set(EngineView._fields) - NOT_INPUTS | properties | methods
    assert set(ON_STOCK_VLLM) == INPUTS


def test_stock_inputs_group_by_source() -> None:
    assert stock_inputs(POLICIES["routebalance"].inputs) == {
        "measured": ["batch_size", "kv_usage"], "kv events": [],
        "estimated": ["decode_tokens"], "router": ["unreported_requests"]}


def policies_inputs() -> dict[str, frozenset[str]]:
    return {n: policy_inputs(p) for n, p in POLICIES.items()}


def pickers_inputs() -> dict[str, frozenset[str]]:
    return {n: p.inputs for n, p in PICKERS.items()}


def test_the_table_has_a_row_per_policy() -> None:
    lines = inputs_table(policies_inputs()).splitlines()
    assert lines[0] == "| policy | measured | from KV events | estimated on stock vLLM |"
    assert [ln.split(" | ")[0] for ln in lines[2:]] == [f"| `{n}`" for n in sorted(POLICIES)]
    assert all(ln.count("|") == 5 for ln in lines)
    assert "| `round_robin` | - | - | - |" in lines


def doc_table(doc: str, section: str) -> str:
    """The first table after ``section`` in ``doc``."""
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    assert section in text, f"docs/{doc} lost its section {section!r}"
    lines = text.split(section, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
               len(lines))
    return "\n".join(lines[start:end]) + "\n"


def test_the_doc_shows_the_table() -> None:
    assert doc_table("router.md", SECTION) == inputs_table(policies_inputs()), \
        "docs/router.md is stale: paste tests.unit.test_policy_inputs's " \
        "inputs_table(policies_inputs())"


def test_the_policies_doc_shows_the_pickers_table() -> None:
    assert doc_table("policies.md", PICKERS_SECTION) == inputs_table(pickers_inputs(),
                                                                     "picker"), \
        "docs/policies.md is stale: paste tests.unit.test_policy_inputs's " \
        "inputs_table(pickers_inputs(), \"picker\")"
