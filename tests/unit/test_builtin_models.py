"""engine_ext.builtin_models: build, cache, tokenizer and configs (no vLLM engine)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_ext import builtin_models as bm

REPO = Path(__file__).resolve().parents[2]
TINY = ("tiny-a", "tiny-b")
TWINS = tuple(name for name, m in bm.BUILTIN_MODELS.items() if m.shape_twin)
CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every built-in model, built once into a module-wide temporary cache."""
    cache = tmp_path_factory.mktemp("hetserve-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HETSERVE_CACHE", str(cache))
        return {name: Path(bm.resolve_model(bm.PREFIX + name)) for name in bm.BUILTIN_MODELS}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache for this test only."""
    monkeypatch.setenv("HETSERVE_CACHE", str(tmp_path))
    return tmp_path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_resolve_builds_into_cache_then_reuses_it(
        built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    cache_root = built["tiny-a"].parents[1]
    monkeypatch.setenv("HETSERVE_CACHE", str(cache_root))
    for name, path in built.items():
        assert path.is_absolute() and path.is_dir()
        assert path.parent == cache_root / "models" and path.name.startswith(name + "-")
    assert not list(cache_root.rglob("*.tmp-*")), "a temporary build folder was left behind"

    def no_rebuild(*_: object) -> None:
        raise AssertionError("rebuilt a cached model")

    def files() -> dict[Path, tuple[int, int]]:
        return {p: (p.stat().st_mtime_ns, p.stat().st_size)
                for p in cache_root.rglob("*") if p.is_file()}

    monkeypatch.setattr(bm, "_build_model", no_rebuild)
    monkeypatch.setattr(bm, "_build_tokenizer", no_rebuild)
    before = files()
    again = {name: Path(bm.resolve_model(bm.PREFIX + name)) for name in bm.BUILTIN_MODELS}
    assert again == built
    assert files() == before, "the cache was written to on a reuse"


def test_unknown_builtin_name_lists_available_names() -> None:
    with pytest.raises(ValueError) as err:
        bm.resolve_model("builtin:tiny-z")
    assert "tiny-z" in str(err.value)
    for name in bm.BUILTIN_MODELS:
        assert f"builtin:{name}" in str(err.value)
    with pytest.raises(ValueError):
        bm.load_format("builtin:tiny-z")


@pytest.mark.parametrize("spec", ["/models/qwen", "Qwen/Qwen2.5-0.5B-Instruct", "./m", ""])
def test_other_specs_pass_through(spec: str) -> None:
    assert bm.resolve_model(spec) == spec
    assert bm.load_format(spec) is None


def test_tokenizer_round_trips_and_speaks_chatml(built: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built["tiny-a"])
    text = "def f(x):\n\treturn x  # héllo, 世界 ✓\n"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok) == bm.VOCAB_SIZE
    assert tok.convert_tokens_to_ids(list(bm.SPECIAL_TOKENS)) == [0, 1, 2]
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", bm.TOKEN_IDS["eos_token_id"])
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", bm.TOKEN_IDS["pad_token_id"])

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template(messages, tokenize=False).endswith("assistant\n")
    assert tok.encode(prompt).count(tok.convert_tokens_to_ids("<|im_start|>")) == 3


def test_all_models_share_one_tokenizer(built: dict[str, Path]) -> None:
    for file in bm.TOKENIZER_FILES:
        assert len({sha256(path / file) for path in built.values()}) == 1, file


def test_tiny_models_load_with_transformers_and_differ_in_size(built: dict[str, Path]) -> None:
    from transformers import AutoConfig

    configs = {name: AutoConfig.from_pretrained(built[name]) for name in TINY}
    assert [c.model_type for c in configs.values()] == ["llama", "qwen2"]
    for c in configs.values():
        assert c.hidden_size // c.num_attention_heads in CPU_HEAD_SIZES
        assert c.vocab_size == bm.VOCAB_SIZE and c.max_position_embeddings == 4096
        assert c.eos_token_id == bm.TOKEN_IDS["eos_token_id"]
    a, b = (bm.param_count(bm.BUILTIN_MODELS[name]) for name in TINY)
    assert b > 5 * a
    weights = [built[name] / "model.safetensors" for name in TINY]
    assert weights[1].stat().st_size > 5 * weights[0].stat().st_size


@pytest.mark.parametrize("name", TWINS)
def test_shape_twins_have_only_config_and_tokenizer(built: dict[str, Path], name: str) -> None:
    from transformers import AutoConfig

    path = built[name]
    assert {p.name for p in path.iterdir()} == {
        "config.json", "generation_config.json", *bm.TOKENIZER_FILES}
    assert bm.load_format(bm.PREFIX + name) == "dummy"
    config = AutoConfig.from_pretrained(path)
    assert config.vocab_size > bm.VOCAB_SIZE
    assert config.max_position_embeddings >= 8192
    assert config.hidden_size // config.num_attention_heads in CPU_HEAD_SIZES


def test_real_shapes_are_the_public_ones() -> None:
    assert bm.param_count(bm.BUILTIN_MODELS["qwen2.5-0.5b-shape"]) == 494_032_768
    assert bm.param_count(bm.BUILTIN_MODELS["qwen2.5-1.5b-shape"]) == 1_543_714_304
    assert bm.param_count(bm.BUILTIN_MODELS["qwen2.5-7b-shape"]) == 7_615_616_512
    assert bm.param_count(bm.BUILTIN_MODELS["smollm2-135m-shape"]) == 134_515_008


def test_load_format_of_random_weight_models_is_default() -> None:
    assert [bm.load_format(bm.PREFIX + name) for name in TINY] == [None, None]


def test_concurrent_builds_in_two_processes_give_one_folder(
        built: dict[str, Path], tmp_path: Path) -> None:
    code = "from engine_ext.builtin_models import resolve_model as r; print(r('builtin:tiny-a'))"
    env = {**os.environ, "HETSERVE_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs[0] == outputs[1]
    path = Path(outputs[0])
    assert [p.name for p in (tmp_path / "models").iterdir() if p.is_dir()] == [path.name]
    assert not list(tmp_path.rglob("*.tmp-*"))
    # Built in another process, yet byte-identical to the in-process build.
    for file in ("model.safetensors", "config.json", *bm.TOKENIZER_FILES):
        assert sha256(path / file) == sha256(built["tiny-a"] / file), file


def test_rebuild_gives_identical_weights(built: dict[str, Path], cache: Path) -> None:
    path = Path(bm.resolve_model("builtin:tiny-b"))
    assert path.parents[1] == cache and path.name == built["tiny-b"].name
    assert sha256(path / "model.safetensors") == sha256(built["tiny-b"] / "model.safetensors")


def test_failed_build_leaves_nothing_behind(cache: Path) -> None:
    target = cache / "models" / "broken-0000"
    stale = cache / "models" / ".broken-0000.tmp-old"
    stale.mkdir(parents=True)

    def fail(dest: Path) -> None:
        (dest / "half-written").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        bm._ensure_built(target, fail)
    assert not target.exists()
    assert not list(target.parent.glob(".broken-0000.tmp-*"))


def test_cli_build_and_list(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HETSERVE_CACHE", str(built["tiny-a"].parents[1]))
    bm.main(["build", "tiny-a"])
    assert capsys.readouterr().out == f"builtin:tiny-a: cached -> {built['tiny-a']}\n"
    bm.main(["list"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "ARCHITECTURE", "PARAMS"]
    assert len(lines) == 1 + len(bm.BUILTIN_MODELS)
    assert all(str(built[line.split()[0][len(bm.PREFIX):]]) in line for line in lines[1:])
    with pytest.raises(SystemExit):
        bm.main(["build", "tiny-z"])
