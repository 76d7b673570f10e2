"""The router's tokenizer fast path gives the token ids the transformers tokenizer gives
(``router.tokenize.ModelTokenizer.encode``), on the built-in models' tokenizer; the token
count bound (``TokenBound``) is never below the count, on that tokenizer and on ones with
the Qwen2 and SmolLM2 pipelines."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_ext.builtin_models import resolve_model
from router.admission.parse import parse_request
from router.request import ParsedRequest
from router.tokenize import ModelTokenizer, TokenBound


@pytest.fixture(scope="module")
def tok() -> ModelTokenizer:
    return ModelTokenizer(resolve_model("builtin:tiny-a"))


TEXTS = ["", "hello", " leading space", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
         "tabs\tand\nnewlines\r\n", "unicode: héllo wörld 你好 😀", "x" * 5000, "<|endoftext|>"]


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_fast_path_matches_the_tokenizer(tok: ModelTokenizer, text: str, special: bool) -> None:
    assert tok._fast is not None  # the built-in tokenizer is a fast one
    assert tok.encode(text, special) == tok._tok.encode(text, add_special_tokens=special)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300), special=st.booleans())
def test_fast_path_matches_on_any_text(tok: ModelTokenizer, text: str, special: bool) -> None:
    assert tok.encode(text, special) == tok._tok.encode(text, add_special_tokens=special)


def test_a_fast_path_that_disagrees_is_not_used(tok: ModelTokenizer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper that edits text in Python (here: lower-cases it) makes the router keep
    calling the wrapper."""
    from transformers import AutoTokenizer

    original = AutoTokenizer.from_pretrained

    def lowering(*args: object, **kwargs: object) -> object:
        wrapped = original(*args, **kwargs)
        encode = wrapped.encode
        monkeypatch.setattr(wrapped, "encode", lambda text, **kw: encode(text.lower(), **kw))
        return wrapped

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lowering)
    edited = ModelTokenizer(tok.path)
    assert edited._fast is None and edited.encode("Hi", False) == tok.encode("hi", False)


def test_built_in_models_load_as_auto_tokenizer_loads_them(tok: ModelTokenizer) -> None:
    """The router loads the built-in models' tokenizer (one for all of them) as
    transformers' generic fast tokenizer, without AutoTokenizer's class resolution
    (``generic``): AutoTokenizer resolves it to the same class, and both give the same ids,
    chat prompts and decoded texts."""
    from transformers import PreTrainedTokenizerFast

    generic = ModelTokenizer(tok.path, generic=True)
    assert type(tok._tok) is type(generic._tok) is PreTrainedTokenizerFast
    for text in TEXTS:
        for special in (True, False):
            assert generic.encode(text, special) == tok.encode(text, special)
            assert generic._tok.encode(text, add_special_tokens=special) == \
                tok._tok.encode(text, add_special_tokens=special)
    for messages in ([{"role": "user", "content": t} for t in TEXTS],
                     [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "hi"}]):
        parsed = _chat(messages)
        assert generic.prompt(parsed) == tok.prompt(parsed)
    ids = tok.encode(TEXTS[5], False)
    assert generic._tok.decode(ids) == tok._tok.decode(ids)


def test_a_router_s_built_in_tokenizers_load_without_torch() -> None:
    """Loading the tokenizers of built-in models imports neither torch nor scikit-learn
    (AutoTokenizer's class resolution imports both: most of a router's start)."""
    code = ("import sys; from router.tokenize import Tokenizers; "
            "Tokenizers({'a': 'builtin:tiny-a', 'b': 'builtin:tiny-b'}).load(); "
            "print(sorted({'torch', 'sklearn'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


# ---------------------------------------------------------------- token count bound

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>"]
TEXT = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(SPECIALS),
                          st.text(st.characters(max_codepoint=127), max_size=40),
                          st.sampled_from(["😀👩‍👩‍👧", "ﬁ㍿", "\u0958\ufb2c", "\U0001d160", " \n\t"])),
                max_size=8).map("".join)
"""Any text, with special tokens' text, ASCII runs, emoji and characters that Unicode
normalization lengthens (U+0958, U+FB2C, U+1D160 under NFC; U+337F under NFKC)."""
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Qwen2's pre-tokenizer regex."""


def _trained(normalizer: Any, pre: Any, post: Any = None) -> Any:
    """A small byte-level BPE trained here, with the given pipeline around it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre, decoders.ByteLevel()
    tok.train_from_iterator(
        ["def main():\n    return 42  # the answer", "héllo wörld 你好, 12345 😀"] * 20,
        trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if post is not None:
        tok.post_processor = post
    return tok


def _pipelines() -> dict[str, Any]:
    """The shipped tokenizer (every built-in model's, the Qwen and SmolLM shape twins'
    included) and ones trained here with the real Qwen2 and SmolLM2 pipelines (NFC and
    the Qwen2 split; single digits), one with a post-processor adding BOS and EOS."""
    from tokenizers import Regex, normalizers, pre_tokenizers, processors

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return {
        "builtin": ModelTokenizer(resolve_model("builtin:tiny-a"))._fast,
        "qwen2-like": _trained(normalizers.NFC(), pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"), byte_level])),
        "smollm2-like": _trained(None, pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False)])),
        "nfkc-bos-eos": _trained(normalizers.NFKC(), pre_tokenizers.ByteLevel(
            add_prefix_space=False), processors.TemplateProcessing(
                single="<s> $A </s>", special_tokens=[("<s>", 3), ("</s>", 4)])),
    }


@pytest.fixture(scope="module")
def pipelines() -> dict[str, Any]:
    return _pipelines()


@pytest.mark.parametrize("name", ["builtin", "qwen2-like", "smollm2-like", "nfkc-bos-eos"])
@settings(max_examples=300, deadline=None)
@given(text=TEXT, special=st.booleans())
def test_the_bound_holds_on_any_text(pipelines: dict[str, Any], name: str, text: str,
                                     special: bool) -> None:
    tok = pipelines[name]
    bound = TokenBound.of(tok)
    assert bound is not None
    limit = bound.tokens(text, special)
    if limit is not None:
        assert len(tok.encode(text, add_special_tokens=special).ids) <= limit
    if text.isascii() or name in ("builtin", "smollm2-like"):  # no normalizer
        assert limit is not None


def test_the_bound_counts_the_post_processors_tokens(pipelines: dict[str, Any]) -> None:
    tok = pipelines["nfkc-bos-eos"]
    bound = TokenBound.of(tok)
    assert bound is not None and bound.special_tokens == 2
    assert len(tok.encode("a", add_special_tokens=True).ids) == 3 == bound.tokens("a", True)


def test_normalized_non_ascii_text_gets_no_bound(pipelines: dict[str, Any]) -> None:
    tok = pipelines["qwen2-like"]
    bound = TokenBound.of(tok)
    assert bound is not None and bound.tokens("\U0001d160", False) is None
    assert len(tok.encode("\U0001d160").ids) > len("\U0001d160".encode())  # why not


def test_pipelines_the_argument_does_not_cover_get_no_bound() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = _trained(None, pre_tokenizers.ByteLevel(add_prefix_space=True))
    assert TokenBound.of(tok) is None  # a space of its own before the text
    metaspace = _trained(None, pre_tokenizers.Metaspace())
    assert TokenBound.of(metaspace) is None
    padded = _trained(None, pre_tokenizers.ByteLevel(add_prefix_space=False))
    padded.enable_padding(length=64)
    assert TokenBound.of(padded) is None
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    assert TokenBound.of(wordpiece) is None


def _chat(messages: list[dict[str, Any]], **body: Any) -> ParsedRequest:
    raw = json.dumps({"model": "tiny-a", "messages": messages, **body}).encode()
    return parse_request("chat", raw, {})


@settings(max_examples=150, deadline=None)
@given(contents=st.lists(TEXT, min_size=1, max_size=4), system=st.booleans(),
       special=st.booleans(), generation=st.booleans())
def test_a_chat_prompts_bound_covers_its_template(tok: ModelTokenizer, contents: list[str],
                                                  system: bool, special: bool,
                                                  generation: bool) -> None:
    """The template's own tokens (role headers, special tokens) are in the bound too."""
    roles = ["system"] * system + ["user", "assistant"] * len(contents)
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents)]
    parsed = _chat(messages, add_special_tokens=special, add_generation_prompt=generation)
    bound = tok.max_prompt_tokens(parsed)
    assert bound is not None and len(tok.prompt(parsed).token_ids) <= bound


def test_the_bound_of_completions(tok: ModelTokenizer) -> None:
    text = "<|im_start|>hello 😀"
    parsed = parse_request("completion", json.dumps({"model": "a", "prompt": text}).encode(),
                           {})
    assert len(tok.prompt(parsed).token_ids) <= tok.max_prompt_tokens(parsed) == \
        len(text.encode())
    ids = parse_request("completion", b'{"model": "a", "prompt": [1, 2, 3]}', {})
    assert tok.max_prompt_tokens(ids) is None  # token ids are counted as given
