"""``ChunkTokenizer``: a text's ids as the concatenation of its whitespace chunks' ids,
memoised (issue 33: tokenizing costs more than the predictors' arithmetic)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from router.predictors.encoder import (ChunkTokenizer, TokenCounter, load_tokenizer,
                                       resolve_encoder)
from router.predictors.sources import load_records

BERT = load_tokenizer(resolve_encoder("minilm")).backend_tokenizer



WHOLE = Tokenizer.from_str(BERT.to_str())
WHOLE.no_truncation()
WHOLE.no_padding()
FRESH = ChunkTokenizer(BERT)

ODD = ["héllo wörld\u00a0x", "a\tb\nc\u3000d", "中文字符 mixed", "x\x00y\x07z",
       "[CLS] a[SEP]b", "", "   ", "e\u0301t\u0301e", "tab\u2028line\u0085nel", "a\x1cb c\x1fd",
       "word " * 700]


def test_equal_to_the_whole_text_on_the_traces_and_odd_text() -> None:
    chunks = ChunkTokenizer(BERT)
    assert chunks.by_chunks
    texts = list(dict.fromkeys(r.user_text for r in load_records(
        ["data/traces/math.jsonl.gz", "data/traces/code.jsonl.gz"])))[:400] + ODD
    for text in texts:
        want = WHOLE.encode(text, add_special_tokens=False).ids
        assert chunks.ids(text) == want, text[:80]
        assert chunks.ids(text, 7) == want[:7]
        assert chunks.count(text) == len(want)  # remembered by now: the counting path
    assert len(chunks.ids("word " * 700)) == 700  # no truncation carried from the file


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_equal_on_any_text(text: str) -> None:
    want = WHOLE.encode(text, add_special_tokens=False).ids
    chunks = FRESH
    chunks.memo.clear()  # as new: a ChunkTokenizer copies the tokenizer (50 ms)
    chunks.counted.clear()
    assert chunks.count(text) == len(want)  # learning
    assert chunks.ids(text) == want  # remembered
    assert chunks.count(text) == len(want)


def test_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ChunkTokenizer, "MAX_CHUNKS", 10)
    chunks = ChunkTokenizer(BERT)
    for i in range(100):
        chunks.ids(f"w{i} x{i} y{i}")
        assert len(chunks.memo) <= 10
    assert chunks.ids("w1 x1") == WHOLE.encode("w1 x1", add_special_tokens=False).ids
    many = " ".join(f"v{i}" for i in range(30))  # more new chunks than the memo holds
    assert chunks.ids(many) == WHOLE.encode(many, add_special_tokens=False).ids
    assert len(chunks.memo) <= 10
    assert chunks.ids(many, 5) == WHOLE.encode(many, add_special_tokens=False).ids[:5]
    monkeypatch.setattr(ChunkTokenizer, "MAX_TEXTS", 3)
    monkeypatch.setattr(ChunkTokenizer, "MAX_TEXT_CHARS", 20)
    for i in range(10):
        assert chunks.count(f"t{i} u{i}") == len(WHOLE.encode(f"t{i} u{i}").ids) - 2
        assert len(chunks.counted) <= 3
    assert chunks.count("long " * 10) == 10 and "long " * 10 not in chunks.counted


def test_new_chunks_tokenized_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text's unknown chunks (repeats, accents, CJK, a chunk with no token, one longer
    than WordPiece's 100 characters) go to the tokenizer in one call, split back to each
    chunk's own ids; with a limit, only the chunks that can count."""
    chunks = ChunkTokenizer(BERT)
    calls: list[str] = []
    encode = chunks.tokenizer.encode
    monkeypatch.setattr(chunks, "tokenizer", type("T", (), {"encode": lambda self, t, **kw: (
        calls.append(t), encode(t, **kw))[1]})())
    text = "Héllo, wörld! 中文 \u200b x" + "y" * 120 + " don't naïve Héllo, e\u0301"
    assert chunks.ids(text) == WHOLE.encode(text, add_special_tokens=False).ids
    assert len(calls) == 1
    for chunk in text.split():
        assert chunks.memo[chunk] == WHOLE.encode(chunk, add_special_tokens=False).ids
    assert chunks.memo["\u200b"] == []
    calls.clear()
    assert chunks.ids("known Héllo, new1 new2 new3 new4", 3) == \
        WHOLE.encode("known Héllo, new1", add_special_tokens=False).ids[:3]
    assert calls == ["known new1"]  # not the chunks past the limit


def test_other_pre_tokenizers_take_the_whole_text() -> None:
    """A tokenizer that does not split on whitespace first (byte-level BPE marks a word's
    leading space) is not split into chunks."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert not ChunkTokenizer(bpe).by_chunks


def test_token_counter_counts_through_it() -> None:
    counter = TokenCounter(load_tokenizer(resolve_encoder("minilm")))
    assert counter.counts(["a", "b c d e", "word " * 300]) == [1, 4, 300]
