"""The router's tokenizer fast path gives the token ids the transformers tokenizer gives
(``router.tokenize.ModelTokenizer.encode``), on the built-in models' tokenizer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_ext.builtin_models import resolve_model
from router.tokenize import ModelTokenizer


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
