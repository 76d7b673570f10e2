"""No class in ``router/`` or ``launcher/`` has more than ``MAX_METHODS`` methods (issue 56).

A method is a function defined in the class body: dunders, properties and static methods
count, nested classes are classes of their own. Each module is parsed, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("router", "launcher")
MAX_METHODS = 16


def class_sizes(path: Path) -> list[tuple[str, int]]:
    """``(qualified name, methods)`` of every class in the module at ``path``."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                out.append((name, sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                      for n in child.body)))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return out


def test_the_counter_counts_every_kind_of_method(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("class A:\n    x = 1\n    def __init__(self): pass\n"
                      "    @property\n    def p(self): pass\n"
                      "    @staticmethod\n    def s(): pass\n"
                      "    async def a(self):\n        def inner(): pass\n"
                      "    class B:\n        def b(self): pass\n"
                      "def f():\n    class C:\n        def c(self): pass\n")
    assert class_sizes(module) == [("A", 4), ("A.B", 1), ("C", 1)]


def test_no_class_has_more_than_16_methods() -> None:
    modules = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert len(modules) > 50, "router/ and launcher/ not found"
    over = [f"{path.relative_to(ROOT)}: {name} has {n} methods"
            for path in modules for name, n in class_sizes(path) if n > MAX_METHODS]
    assert not over, f"over {MAX_METHODS} methods (split the class by job):\n" + "\n".join(over)
