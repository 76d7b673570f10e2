"""The documentation is true: README.md and docs/**/*.md, read as a new user would.

Reads the docs at test time, so it follows code that moves:

- Python blocks compile; every ``import x`` / ``from x import y`` imports, and ``y``
  exists. A block runs (from the repository root) unless it opens a connection, which
  this test reads as: it names a URL (``://``).
- TOML blocks parse; a block that is a cluster file (a ``[router]`` or ``[[engines]]``
  table) loads with the project's loader, and every ``--flag`` of its engines'
  ``extra_args`` exists in vLLM's server (engines pass unknown arguments to it).
- Every ``python -m MODULE [SUB ...] ...`` command (also ``.venv/bin/python -m`` and the
  Makefile's ``$(PY) -m``), in fenced blocks, inline code and Makefile recipes: the module
  exists, and each ``--flag`` exists in ``python -m MODULE [SUB ...] --help``, run once per
  command, as ``-m`` runs it, by two help servers: subprocesses that load the libraries
  the commands share once (a process per command took about 4 minutes of CPU, these 40 s).
  SUB is a word the parent's help lists as a command (argparse's ``{a,b} ...`` or a
  ``commands:`` section); ``A|B`` alternatives accept a flag of either. A command whose
  help says unknown arguments go to vLLM also takes vLLM's flags.

A block that is deliberately partial is marked by the line ``<!-- fragment -->`` right
before its fence: a Python or TOML fragment is still parsed (and import-checked), never
run or loaded; a shell fragment's commands are not checked.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.settings import load_launch_config
from router.config.engines import LocalEngine

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FRAGMENT = "<!-- fragment -->"
VLLM_SERVER = ("vllm.entrypoints.launchers.api_server.entry",)
"""vLLM's OpenAI server, which engine_ext.serve hands every argument it does not know."""
PASSTHROUGH = re.compile(r"arguments go to vLLM", re.I)
HELP_WORKERS = 2
HELP_TIMEOUT_S = 180


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""
    where: str
    lang: str
    text: str
    fragment: bool


@dataclass(frozen=True)
class Command:
    """One ``python -m MODULE ...`` invocation in the docs or the Makefile."""
    where: str
    module: str
    words: tuple[str, ...]
    """The tokens after the module, up to the first that is not a bare word."""
    flags: tuple[str, ...]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+)\s*(\S*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, start = len(m.group(1)), m.group(2), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        fragment = start > 0 and lines[start - 1].strip() == FRAGMENT
        body = "\n".join(ln[indent:] for ln in lines[start + 1:j]) + "\n"
        yield Block(f"{_rel(path)}:{start + 1}", m.group(3).lower(), body, fragment)
        i = j + 1


def _blocks(*langs: str) -> list[Block]:
    return [b for p in DOCS for b in fenced_blocks(p) if b.lang in langs]


def _param(blocks: list[Block]) -> list[pytest.param]:
    return [pytest.param(b, id=b.where) for b in blocks]


# ---------------------------------------------------------------- python blocks


@pytest.mark.parametrize("block", _param(_blocks("python", "py")))
def test_python_block(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    code = compile(block.text, block.where, "exec")
    for node in ast.walk(ast.parse(block.text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}") is not None, \
                    f"{block.where}: {node.module} has no {alias.name}"
    if block.fragment or "://" in block.text:
        return
    monkeypatch.chdir(ROOT)
    exec(code, {"__name__": "__doc_block__"})


# ---------------------------------------------------------------- TOML blocks


def _is_cluster_file(text: str) -> bool:
    return re.search(r"^\s*(\[router\]|\[\[engines\]\])", text, re.M) is not None


@pytest.mark.parametrize("block", _param(_blocks("toml")))
def test_toml_block(block: Block, tmp_path: Path, vllm_flags: frozenset[str]) -> None:
    tomllib.loads(block.text)
    if block.fragment or not _is_cluster_file(block.text):
        return
    path = tmp_path / "cluster.toml"
    path.write_text(block.text, encoding="utf-8")
    cfg = load_launch_config(path)
    unknown = {f.split("=")[0] for e in cfg.engines if isinstance(e, LocalEngine)
               for f in e.extra_args if f.startswith("--")} - vllm_flags
    assert not unknown, f"{block.where}: extra_args {sorted(unknown)} are not vLLM flags"


# ---------------------------------------------------------------- commands

_COMMAND = re.compile(r"(?:(?:\S*/)?python3?|\$\(PY\))\s+-m\s+([A-Za-z_][\w.]*)(.*)")
_END = re.compile(r"\s(?:#|\||;|&&|>|2>)\s|`")
_BARE = re.compile(r"^[a-z][a-z0-9_-]*(\|[a-z][a-z0-9_-]*)*$")
_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")


def _command(where: str, line: str) -> Command | None:
    m = _COMMAND.search(line)
    if m is None:
        return None
    rest = _END.split(m.group(2) + " ", maxsplit=1)[0].replace("\\|", "|")
    tokens = rest.split()
    words: list[str] = []
    for t in tokens:
        if not _BARE.match(t):
            break
        words.append(t)
    flags = tuple(sorted({f for t in tokens for f in _FLAG.findall(t)}))
    return Command(where, m.group(1), tuple(words), flags)


def _shell_lines(text: str) -> Iterator[tuple[int, str]]:
    """Lines with backslash continuations joined, each with its first line's offset."""
    start, acc = 0, ""
    for i, ln in enumerate(text.splitlines()):
        if not acc:
            start = i
        if ln.rstrip().endswith("\\"):
            acc += ln.rstrip()[:-1] + " "
            continue
        yield start, acc + ln
        acc = ""
    if acc:
        yield start, acc


def _inline_spans(path: Path) -> Iterator[tuple[int, str]]:
    """Inline code spans outside fenced blocks (a span may wrap lines, not paragraphs)."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^\s*```.*?^\s*```", lambda m: "\n" * m.group(0).count("\n"), text,
                  flags=re.M | re.S)
    for m in re.finditer(r"`([^`\n]+(?:\n(?!\s*\n)[^`\n]*)*)`", text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1).replace("\n", " ")


def doc_commands() -> list[Command]:
    out: list[Command] = []
    for path in DOCS:
        for block in fenced_blocks(path):
            if block.lang in ("", "sh", "bash", "shell", "console") and not block.fragment:
                line0 = int(block.where.rsplit(":", 1)[1]) + 1
                for off, ln in _shell_lines(block.text):
                    out.append(_command(f"{_rel(path)}:{line0 + off}", ln))
        out += [_command(f"{_rel(path)}:{n}", span) for n, span in _inline_spans(path)]
    for off, ln in _shell_lines((ROOT / "Makefile").read_text(encoding="utf-8")):
        if ln.startswith("\t"):
            out.append(_command(f"Makefile:{off + 1}", ln))
    return [c for c in out if c is not None]


_WORKER = r"""
import contextlib, io, json, os, runpy, sys
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # output that bypasses sys.stdout cannot break the protocol
for line in sys.stdin:
    argv, out, code = json.loads(line), io.StringIO(), 0
    sys.argv = [argv[0], *argv[1:], "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException as e:
        code, _ = 1, out.write(f"{type(e).__name__}: {e}")
    proto.write(json.dumps([code, out.getvalue()]) + "\n")
    proto.flush()
"""
"""A help server: for each JSON argv line, ``python -m ARGV --help`` run as ``-m`` runs it
(``runpy``), answered as one JSON line ``[exit code, output]``. One process serves many
commands, so the libraries they share (torch, vLLM, scikit-learn) load once."""


class Helps:
    """``python -m ARGV --help`` of each command, run once, on a few help servers."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200"}
        self._servers: queue.Queue[subprocess.Popen[str]] = queue.Queue()
        for _ in range(HELP_WORKERS):
            self._servers.put(subprocess.Popen(
                [sys.executable, "-c", _WORKER], cwd=ROOT, env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        self._pool = ThreadPoolExecutor(HELP_WORKERS)
        self._futures: dict[tuple[str, ...], Future[str]] = {}
        self._lock = threading.Lock()

    def _run(self, argv: tuple[str, ...]) -> str:
        server = self._servers.get()
        try:
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(argv) + "\n")
            server.stdin.flush()
            ready, _, _ = select.select([server.stdout], [], [], HELP_TIMEOUT_S)
            line = server.stdout.readline() if ready else ""
        finally:
            self._servers.put(server)
        assert line, f"python -m {' '.join(argv)} --help: no answer in {HELP_TIMEOUT_S} s"
        code, text = json.loads(line)
        assert code == 0, f"python -m {' '.join(argv)} --help exited {code}:\n{text[-2000:]}"
        return text

    def start(self, argv: tuple[str, ...]) -> None:
        with self._lock:
            if argv not in self._futures:
                self._futures[argv] = self._pool.submit(self._run, argv)

    def get(self, argv: tuple[str, ...]) -> str:
        self.start(argv)
        return self._futures[argv].result()

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        while not self._servers.empty():
            server = self._servers.get()
            server.kill()
            server.wait()


def subcommands(help_text: str) -> set[str]:
    """Commands a help lists: argparse's ``{a,b} ...`` or its ``commands:`` sections
    (``python -m kernels_bench``: ``commands:`` and ``lab commands:``)."""
    names = {n for group in re.findall(r"\{([\w,-]+)\}\s+\.\.\.", help_text)
             for n in group.split(",")}
    for section in re.finditer(r"^(?:\w[\w ]*)?commands:\s*\n((?:[ \t]+\S.*\n?)+)", help_text,
                               re.M):
        names |= {ln.split()[0] for ln in section.group(1).splitlines() if ln.strip()}
    return names


def resolve(helps: Helps, cmd: Command) -> tuple[str, set[str]]:
    """The command's name (``module sub ...``) and the flags its help (or helps, for
    ``A|B``) and, for a passthrough, vLLM's server accept."""
    argvs = [(cmd.module,)]
    for word in cmd.words:
        nxt = [(*a, alt) for a in argvs for alt in word.split("|")
               if alt in subcommands(helps.get(a))]
        if not nxt:
            break
        argvs = nxt
    texts = [helps.get(a) for a in argvs]
    if any(PASSTHROUGH.search(t) for t in texts):
        texts.append(helps.get(VLLM_SERVER))
    return " / ".join(" ".join(a) for a in argvs), {f for t in texts for f in _FLAG.findall(t)}


COMMANDS = doc_commands()
FLAGGED = [c for c in COMMANDS if c.flags]


@pytest.fixture(scope="module")
def helps() -> Iterator[Helps]:
    h = Helps()
    h.start(VLLM_SERVER)  # the slowest: first
    for c in FLAGGED:
        h.start((c.module,))
    yield h
    h.close()


@pytest.fixture(scope="module")
def resolved(helps: Helps) -> dict[Command, tuple[str, set[str]]]:
    """Every command with flags resolved at once, so the helps run in parallel."""
    with ThreadPoolExecutor(16) as pool:
        return dict(zip(FLAGGED, pool.map(lambda c: resolve(helps, c), FLAGGED)))


@pytest.fixture(scope="module")
def vllm_flags(helps: Helps) -> frozenset[str]:
    return frozenset(_FLAG.findall(helps.get(VLLM_SERVER)))


def test_every_module_exists() -> None:
    modules = {c.module for c in COMMANDS}
    assert {"launcher", "router", "kernels_bench"} <= modules, modules
    missing = {c.where: c.module for c in COMMANDS if importlib.util.find_spec(c.module) is None}
    assert not missing, f"no such module: {missing}"


@pytest.mark.parametrize("cmd", [pytest.param(c, id=f"{c.where} {c.module} {' '.join(c.words)}")
                                 for c in FLAGGED])
def test_command_flags(cmd: Command, resolved: dict[Command, tuple[str, set[str]]]) -> None:
    name, accepted = resolved[cmd]
    unknown = [f for f in cmd.flags if f not in accepted | {"--help"}]
    assert not unknown, f"{cmd.where}: python -m {name} has no {', '.join(unknown)}"


# ---------------------------------------------------------------- links and paths

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_DOC_PATH = re.compile(r"(?<![\w/.$-])docs/[\w./{}*,$-]+")
SUPERSEDED = "## Superseded pages"
"""docs/research/README.md's section naming the pages removed or moved (old paths)."""


def _prose(path: Path) -> str:
    """The document without its fenced blocks and inline code (lines kept)."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^\s*```.*?^\s*```", lambda m: "\n" * m.group(0).count("\n"), text,
                  flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file (a repeated heading gets ``-1``, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", _prose_keep_code(path), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _prose_keep_code(path: Path) -> str:
    """The document without its fenced blocks (inline code kept: it is part of headings)."""
    return re.sub(r"^\s*```.*?^\s*```", lambda m: "\n" * m.group(0).count("\n"),
                  path.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_links_resolve() -> None:
    """Every relative link of README.md and docs/ names a file that exists, and a
    ``#fragment`` into a Markdown file names one of its headings."""
    broken = []
    for path in DOCS:
        text = _prose(path)
        for m in _LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            file, _, frag = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{_rel(path)}:{text.count(chr(10), 0, m.start()) + 1}"
            if not dest.exists():
                broken.append(f"{where}: {target} (no such file)")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                broken.append(f"{where}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_doc_paths_exist() -> None:
    """Every ``docs/...`` path the docs name, in prose or code, exists (pages moved into
    docs/research/ leave no stale path behind)."""
    missing = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8").split(SUPERSEDED)[0]
        for n, line in enumerate(text.splitlines(), 1):
            for m in _DOC_PATH.finditer(line):
                name = m.group(0).rstrip(".,")
                if not re.search(r"[{}*$]", name) and not (ROOT / name).exists():
                    missing.append(f"{_rel(path)}:{n}: {name}")
    assert not missing, "\n".join(missing)
