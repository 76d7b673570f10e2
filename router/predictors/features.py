"""The light per-request object predictors consume, and LAAR's coarse request features.

``RequestFeatures`` is what the router enqueues to the batched service (Chimera section
3.8): plain strings and numbers, cheap to build and to pickle; every heavy step
(tokenising, embedding, trees) happens in the predictor.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.predictors.records import StageRecord

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class RequestFeatures:
    system_text: str
    user_text: str
    prompt_text: str
    prompt_tokens: int
    """Full-input tokens as the engine counts them (0: unknown)."""
    workflow: str
    stage: str
    stage_index: int


def from_request(req: RoutingRequest) -> RequestFeatures:
    w = req.workflow
    return RequestFeatures(req.system_text, req.user_text, req.prompt_text,
                           req.num_prompt_tokens, w.workflow or "", w.stage or "",
                           w.stage_index or 0)


def from_record(r: StageRecord) -> RequestFeatures:
    return RequestFeatures(r.system_text, r.user_text, r.prompt_text, r.prompt_tokens,
                           r.workflow, r.stage, r.stage_index)


# ---- LAAR section 5.2: coarse features (language, length bucket, task type) ----

LANGUAGES = ("latin", "cjk", "cyrillic", "arabic", "other")
TASKS = ("code", "math", "chat")
_CODE = re.compile(r"```|\bdef |\bclass |\breturn\b|\bimport |#include|\bfunction\b|=>|;\s*$",
                   re.M)
_MATH = re.compile(r"\d\s*[-+*/^=]\s*\d|\b(?:solve|compute|calculate|how many|how much|"
                   r"find|prove|equation|integer|sum|total|probability)\b", re.I)


def script_of(ch: str) -> str:
    """The script family of one letter, from its Unicode name."""
    name = unicodedata.name(ch, "")
    for key, script in (("CJK", "cjk"), ("HIRAGANA", "cjk"), ("KATAKANA", "cjk"),
                        ("HANGUL", "cjk"), ("CYRILLIC", "cyrillic"), ("ARABIC", "arabic"),
                        ("LATIN", "latin")):
        if key in name:
            return script
    return "other"


def language(text: str) -> str:
    """The script family most of the text's letters belong to (``latin`` if none)."""
    counts: dict[str, int] = {}
    for ch in text[:2000]:
        if ch.isalpha():
            s = script_of(ch)
            counts[s] = counts.get(s, 0) + 1
    return max(counts, key=lambda s: counts[s]) if counts else "latin"


def task_type(text: str) -> str:
    """``code`` if code markers appear, else ``math`` on math markers, else ``chat``."""
    if _CODE.search(text):
        return "code"
    return "math" if _MATH.search(text) else "chat"


def length_bucket(tokens: int, buckets: int) -> int:
    """floor(log2(tokens + 1)), capped at ``buckets - 1``."""
    return min(buckets - 1, int(math.log2(max(0, tokens) + 1)))
