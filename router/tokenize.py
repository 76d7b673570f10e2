"""Per-model tokenizers and chat templates: a request's prompt token ids and text parts.

Tokenizers load from the model's local folder (``builtin:`` specs resolve through
``engine_ext.builtin_models``); nothing is downloaded. The token ids follow vLLM's
OpenAI server so that the router's KV prefix estimates match the engine:

- chat: ``apply_chat_template(messages, tools, add_generation_prompt,
  continue_final_message, **chat_template_kwargs)`` rendered to text, then encoded with
  ``add_special_tokens`` (default False); text content parts are joined with newlines
  (vLLM's "string" content format);
- completion: the prompt encoded with ``add_special_tokens`` (default True), or the
  client's token ids as given.

For policies that read no prompt, ``max_prompt_tokens`` bounds the count without
tokenizing (``TokenBound``): the rendered text's UTF-8 bytes plus the special tokens the
post-processor adds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from engine_ext.builtin_models import is_builtin, resolve_model
from router.request import ParsedRequest, RequestError

INLINE_BYTES = 8192
"""Requests whose body is at most this many bytes are rendered and tokenized on the event
loop (tens of microseconds: a thread hop would cost more), larger ones in a worker thread
(a long prompt would otherwise stall every stream for milliseconds). The body bounds the
work: clients cannot send a template of their own
(``router.admission.bodies.TEMPLATE_KWARGS``), so the model's template renders only what the
body holds."""


_PROBES = (" Hello world", "<|im_start|>user\nhi<|im_end|>\n", "a  b\t\n  c", "héllo 你好")
_TOKENIZER_FILE_PREFIXES = ("tokenizer", "vocab", "merges", "special_tokens", "added_tokens",
                            "chat_template")
_ASCII_STABLE = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
"""Normalizers that leave ASCII text unchanged (and may lengthen other text)."""
_SPLITTERS = frozenset({"Split", "Digits", "Punctuation"})
"""Pre-tokenizers that only cut the text (or drop parts of it)."""


@dataclass(frozen=True)
class TokenBound:
    """An upper bound on a byte-level BPE tokenizer's token count, from the text alone.

    Sound for the tokenizers ``of`` accepts: the text is split, each piece mapped to one
    character per UTF-8 byte (``ByteLevel``, no prefix space) and merged by BPE, so every
    token covers at least one byte; an added (special) token found in the text covers its
    own, non-empty, text. Only the post-processor adds tokens of its own. A Unicode
    normalizer may lengthen non-ASCII text, so with one only ASCII text is bounded."""

    ascii_only: bool
    special_tokens: int
    """Tokens the post-processor adds with ``add_special_tokens``."""

    @classmethod
    def of(cls, tokenizer: Any) -> TokenBound | None:
        """The bound of a ``tokenizers.Tokenizer``, or None when its pipeline is not one
        the argument above covers."""
        spec = json.loads(tokenizer.to_str())
        pre = spec.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
        norm = spec.get("normalizer")
        norms = (norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]) \
            if norm else []
        if ((spec.get("model") or {}).get("type") != "BPE" or spec.get("padding")
                or len(byte_level) != 1 or byte_level[0].get("add_prefix_space")
                or any(s.get("type") not in _SPLITTERS | {"ByteLevel"} for s in steps)
                or any(n.get("type") not in _ASCII_STABLE for n in norms)
                or any(not t.get("content") for t in spec.get("added_tokens") or ())):
            return None
        post = tokenizer.post_processor
        return cls(bool(norms), 0 if post is None else post.num_special_tokens_to_add(False))

    def tokens(self, text: str, add_special_tokens: bool) -> int | None:
        """At least as many tokens as ``text`` encodes to (None: no bound for it)."""
        extra = self.special_tokens if add_special_tokens else 0
        if text.isascii():
            return len(text) + extra
        if self.ascii_only:
            return None
        try:
            return len(text.encode()) + extra
        except UnicodeEncodeError:  # lone surrogates: the tokenizer decides
            return None


@dataclass(frozen=True)
class PromptInfo:
    """The prompt as the engine will see it."""

    token_ids: list[int]
    text: str
    """Rendered prompt (chat template applied), or the completion prompt."""
    system_text: str
    """System and developer messages, newline-joined ("" for completions)."""
    user_text: str
    """The last user message (the whole prompt for completions)."""


class ModelTokenizer:
    """One tokenizer folder's tokenizer and chat template."""

    def __init__(self, path: str, generic: bool = False) -> None:
        """``generic``: the folder is known to load as transformers' generic fast tokenizer
        (the built-in models' folders, tests/unit/test_tokenize.py checks that
        ``AutoTokenizer`` gives that class), which is then loaded directly: resolving the
        class through ``AutoTokenizer`` imports torch and scikit-learn, most of a router's
        start (about 7 of 11 s here)."""
        self.path = path
        if generic:
            from transformers import PreTrainedTokenizerFast

            self._tok = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
        else:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._fast = getattr(self._tok, "_tokenizer", None)
        """The Rust tokenizer behind a fast tokenizer: the same ids without the wrapper's
        per-call overhead; dropped if it disagrees with the wrapper on ``_PROBES`` (a
        wrapper that edits text in Python), tests/unit/test_tokenize.py checks more."""
        if self._fast is not None and any(
                self.encode(text, special) != list(self._tok.encode(
                    text, add_special_tokens=special))
                for text in _PROBES for special in (True, False)):
            self._fast = None
        self.bound = None if self._fast is None else TokenBound.of(self._fast)
        """The token count bound of ``encode``, if its tokenizer is one it covers."""

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """``text``'s token ids, as ``tokenizer.encode`` gives them."""
        if self._fast is not None:  # the batch call skips offsets and word ids
            return list(self._fast.encode_batch_fast(
                [text], add_special_tokens=add_special_tokens)[0].ids)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def prompt(self, parsed: ParsedRequest) -> PromptInfo:
        """Token ids and text parts of a validated request (400 if the template fails)."""
        if parsed.kind == "completion":
            return self._completion(parsed)
        return self._chat(parsed)

    def max_prompt_tokens(self, parsed: ParsedRequest) -> int | None:
        """At least as many tokens as ``prompt(parsed)`` has, without tokenizing (the chat
        template is rendered: 400 if it fails); None when there is no sound bound."""
        if parsed.kind == "completion" and not isinstance(parsed.prompt, str):
            return None  # token ids: ``prompt`` checks them
        if self.bound is None:
            return None
        if parsed.kind != "completion":
            return self.bound.tokens(self._render(parsed),
                                     bool(parsed.body.get("add_special_tokens", False)))
        assert isinstance(parsed.prompt, str)
        return self.bound.tokens(parsed.prompt,
                                 bool(parsed.body.get("add_special_tokens", True)))

    def _render(self, parsed: ParsedRequest) -> str:
        """The chat template applied to the request's messages (400 if it fails; for the
        agents' APIs, whose conversion is the router's, their text joined instead: the
        engine's template judges them)."""
        body = parsed.body
        extra = body.get("chat_template_kwargs")
        try:
            return self._tok.apply_chat_template(
                parsed.messages or [],
                tools=parsed.tools,
                tokenize=False,
                add_generation_prompt=body.get("add_generation_prompt", True),
                continue_final_message=body.get("continue_final_message", False),
                **(extra if isinstance(extra, dict) else {}),
            )
        except Exception as exc:  # templates raise anything on bad user input
            if parsed.kind != "chat":
                return "\n".join(f"{m['role']}: {m.get('content') or ''}"
                                  for m in parsed.messages or [])
            raise RequestError(400, f"the chat template of this model rejected the "
                               f"messages: {exc}", param="messages",
                               code="chat_template_error") from None

    def _chat(self, parsed: ParsedRequest) -> PromptInfo:
        messages = parsed.messages or []
        text = self._render(parsed)
        try:
            ids = self.encode(text, bool(parsed.body.get("add_special_tokens", False)))
        except Exception as exc:  # e.g. lone surrogates in a message
            raise RequestError(400, f"the chat template of this model rejected the "
                               f"messages: {exc}", param="messages",
                               code="chat_template_error") from None
        system = [m["content"] for m in messages
                  if m["role"] in ("system", "developer") and isinstance(m.get("content"), str)]
        users = [m["content"] for m in messages
                 if m["role"] == "user" and isinstance(m.get("content"), str)]
        return PromptInfo(ids, text, "\n".join(system), users[-1] if users else "")

    def _completion(self, parsed: ParsedRequest) -> PromptInfo:
        prompt = parsed.prompt
        try:
            if isinstance(prompt, str):
                ids = self.encode(prompt, bool(parsed.body.get("add_special_tokens", True)))
                text = prompt
            else:
                ids = list(prompt or [])
                text = self._tok.decode(ids)
        except Exception as exc:  # e.g. token ids beyond the vocabulary, lone surrogates
            raise RequestError(400, f"the prompt could not be tokenized: {exc}",
                               param="prompt", code="invalid_prompt") from None
        return PromptInfo(ids, text, "", text)


def _fingerprint(path: str) -> str:
    """Digest of a folder's tokenizer files: equal digests mean identical tokenization."""
    digest = hashlib.sha256()
    folder = Path(path)
    for file in sorted(folder.iterdir()) if folder.is_dir() else []:
        if file.is_file() and file.name.startswith(_TOKENIZER_FILE_PREFIXES):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest() if folder.is_dir() else path


class Tokenizers:
    """Tokenizers of every served model, shared between models with identical files."""

    def __init__(self, models: Mapping[str, str]) -> None:
        """``models``: served model name -> model spec (local path or ``builtin:<name>``)."""
        self._specs = dict(models)
        self._by_model: dict[str, ModelTokenizer] = {}
        self._key: dict[str, str] = {}

    def load(self) -> None:
        """Resolve and load every tokenizer (blocking; builds built-in models if needed)."""
        shared: dict[str, ModelTokenizer] = {}
        for name, spec in self._specs.items():
            path = resolve_model(spec)
            key = _fingerprint(path)
            if key not in shared:
                shared[key] = ModelTokenizer(path, generic=is_builtin(spec))
            self._by_model[name] = shared[key]
            self._key[name] = key

    def same_tokenizer(self, models: list[str]) -> bool:
        """Whether every one of ``models`` tokenizes identically."""
        return len({self._key[m] for m in models}) <= 1

    async def prompt(self, model: str, parsed: ParsedRequest) -> PromptInfo:
        """``model``'s view of the request's prompt."""
        tok = self._by_model[model]
        if parsed.body_bytes <= INLINE_BYTES:
            return tok.prompt(parsed)
        return await asyncio.to_thread(tok.prompt, parsed)

    async def max_prompt_tokens(self, model: str, parsed: ParsedRequest) -> int | None:
        """``ModelTokenizer.max_prompt_tokens`` with ``model``'s tokenizer."""
        tok = self._by_model[model]
        if parsed.body_bytes <= INLINE_BYTES:
            return tok.max_prompt_tokens(parsed)
        return await asyncio.to_thread(tok.max_prompt_tokens, parsed)

