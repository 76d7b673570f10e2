"""A model's ``config.json`` and the sizes read from it, importable with the standard library
alone (the torch-only kernel benchmark, ``kernels_bench.floor``, reads shapes through it).

``model_config``: a built-in model's config or a local folder's; ``kv_bytes_per_token``:
what one token of KV cache costs; ``shape_name``: the name a shape goes by in a measured
floor file (``qwen2.5-1.5b`` for ``builtin:qwen2.5-1.5b-shape``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_ext.builtin_models import BUILTIN_MODELS, PREFIX

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
SHAPE_SUFFIX = "-shape"


def model_config(model: str, base_dir: Path) -> dict[str, Any]:
    """The model's ``config.json``: a built-in's, or read from a local folder (relative to
    ``base_dir``)."""
    if model.startswith(PREFIX):
        name = model[len(PREFIX):]
        if name not in BUILTIN_MODELS:
            raise ValueError(f"model {model!r}: built-in models are "
                             + ", ".join(PREFIX + m for m in BUILTIN_MODELS))
        return BUILTIN_MODELS[name].hf_config()
    path = Path(model).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not (path / "config.json").is_file():
        raise ValueError(f"model {model!r}: no config.json to read the model's shape from "
                         "(give a built-in model or a local folder)")
    return json.loads((path / "config.json").read_text())


def kv_bytes_per_token(config: dict[str, Any], dtype: str | None) -> int:
    """2 x layers x KV heads x head size x dtype bytes (``dtype`` None or auto: the
    model's ``torch_dtype``)."""
    name = config.get("torch_dtype", "float32") if dtype in (None, "auto") else dtype
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name!r}: the twin knows {', '.join(DTYPE_BYTES)}")
    heads = config["num_attention_heads"]
    head_size = config.get("head_dim") or config["hidden_size"] // heads
    return (2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads)
            * head_size * DTYPE_BYTES[name])


def shape_name(model: str) -> str:
    """A shape's name in a floor file: a built-in's name without ``-shape``, else the
    folder's name."""
    if model.startswith(PREFIX):
        name = model[len(PREFIX):]
        return name[:-len(SHAPE_SUFFIX)] if name.endswith(SHAPE_SUFFIX) else name
    return Path(model).expanduser().resolve().name
