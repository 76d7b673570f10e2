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
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from engine_ext.builtin_models import resolve_model
from router.request import ParsedRequest, RequestError

INLINE_BYTES = 8192
"""Requests whose body is at most this many bytes are rendered and tokenized on the event
loop (tens of microseconds: a thread hop would cost more), larger ones in a worker thread
(a long prompt would otherwise stall every stream for milliseconds). The body bounds the
work: clients cannot send a template of their own (``router.request.TEMPLATE_KWARGS``),
so the model's template renders only what the body holds."""


_PROBES = (" Hello world", "<|im_start|>user\nhi<|im_end|>\n", "a  b\t\n  c", "héllo 你好")
_TOKENIZER_FILE_PREFIXES = ("tokenizer", "vocab", "merges", "special_tokens", "added_tokens",
                            "chat_template")


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

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.path = path
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

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """``text``'s token ids, as ``tokenizer.encode`` gives them."""
        if self._fast is not None:  # the batch call skips offsets and word ids
            return list(self._fast.encode_batch_fast(
                [text], add_special_tokens=add_special_tokens)[0].ids)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def prompt(self, parsed: ParsedRequest) -> PromptInfo:
        """Token ids and text parts of a validated request (400 if the template fails)."""
        if parsed.kind == "chat":
            return self._chat(parsed)
        return self._completion(parsed)

    def _chat(self, parsed: ParsedRequest) -> PromptInfo:
        body, messages = parsed.body, parsed.messages or []
        extra = body.get("chat_template_kwargs")
        try:
            text = self._tok.apply_chat_template(
                messages,
                tools=body.get("tools"),
                tokenize=False,
                add_generation_prompt=body.get("add_generation_prompt", True),
                continue_final_message=body.get("continue_final_message", False),
                **(extra if isinstance(extra, dict) else {}),
            )
            ids = self.encode(text, bool(body.get("add_special_tokens", False)))
        except Exception as exc:  # templates raise anything on bad user input
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
                shared[key] = ModelTokenizer(path)
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

