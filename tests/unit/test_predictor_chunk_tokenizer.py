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
    assert len(chunks.ids("word " * 700)) == 700  # no truncation carried from the file


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_equal_on_any_text(text: str) -> None:
    assert ChunkTokenizer(BERT).ids(text) == WHOLE.encode(text, add_special_tokens=False).ids


def test_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ChunkTokenizer, "MAX_CHUNKS", 10)
    chunks = ChunkTokenizer(BERT)
    for i in range(100):
        chunks.ids(f"w{i} x{i} y{i}")
        assert len(chunks.memo) <= 10
    assert chunks.ids("w1 x1") == WHOLE.encode("w1 x1", add_special_tokens=False).ids


def test_other_pre_tokenizers_take_the_whole_text() -> None:
    """A tokenizer that does not split on whitespace first (byte-level BPE marks a word's
    leading space) is not split into chunks."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert not ChunkTokenizer(bpe).by_chunks


def test_token_counter_counts_through_it() -> None:
    counter = TokenCounter(load_tokenizer(resolve_encoder("minilm")))
    assert counter.counts(["a", "b c d e", "word " * 300]) == [1, 4, 300]
