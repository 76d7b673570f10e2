"""A Llama/Qwen2-shaped decoder in plain torch with random weights (speed depends on the
shape only), and its step split into the parts the benchmark times.

Per layer: RMSNorm, fused QKV projection, the new tokens' K and V written into a
preallocated cache, grouped-query attention over the cache (``scaled_dot_product_attention``),
output projection, RMSNorm, fused gate/up projection, SiLU x up, down projection; then
the final norm, the LM head on each sequence's last token and an argmax. Left out:
rotary embeddings, Qwen2's q/k/v biases and the embedding lookup (the input is a hidden
state): element-wise work beside the GEMMs. Follows ``step_probe.py``, the script that
measured the first floor (docs/research/twin/floors/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

WEIGHT_SCALE = 0.02
"""Random weights are N(0, 1) x this (keeps activations finite through the layers)."""


@dataclass(frozen=True)
class DecoderShape:
    """What the benchmark builds from a model's ``config.json``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DecoderShape:
        """A Llama- or Qwen2-style ``config.json``; a missing key is a ValueError naming it."""
        try:
            heads = int(config["num_attention_heads"])
            return cls(hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]),
                       heads=heads, kv_heads=int(config.get("num_key_value_heads", heads)),
                       head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
                       intermediate=int(config["intermediate_size"]),
                       vocab=int(config["vocab_size"]))
        except KeyError as e:
            raise ValueError(f"config.json has no {e.args[0]!r}: not a Llama/Qwen2-style "
                             "decoder") from None


class Decoder:
    """Weights of one shape and a KV cache of ``max_batch`` x ``max_tokens`` tokens; each
    call works on the first ``batch`` sequences and a prefix of the cache (views, no copy)."""

    def __init__(self, shape: DecoderShape, max_batch: int, max_tokens: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.shape = shape
        s = shape
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim

        def rand(*size: int) -> torch.Tensor:
            return torch.randn(*size, device=device, dtype=dtype) * WEIGHT_SCALE

        self.qkv = [rand(q + 2 * kv, s.hidden) for _ in range(s.layers)]
        self.o = [rand(s.hidden, q) for _ in range(s.layers)]
        self.gate_up = [rand(2 * s.intermediate, s.hidden) for _ in range(s.layers)]
        self.down = [rand(s.hidden, s.intermediate) for _ in range(s.layers)]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = rand(s.vocab, s.hidden)
        cache = (s.layers, max_batch, s.kv_heads, max_tokens, s.head_dim)
        self.k = torch.zeros(cache, device=device, dtype=dtype)
        self.v = torch.zeros(cache, device=device, dtype=dtype)

    def step(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """One forward step: ``x`` [B, T, hidden] holds T new tokens of each of B sequences,
        written at cache positions ``pos .. pos + T - 1``; returns the next token ids [B]."""
        s = self.shape
        b, t, _ = x.shape
        for i in range(s.layers):
            y = F.rms_norm(x, (s.hidden,), self.norm)
            q, k, v = (y @ self.qkv[i].t()).split(
                [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
            self.k[i, :b, :, pos:pos + t] = k.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            self.v[i, :b, :, pos:pos + t] = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            a = self._attend(i, q.view(b, t, s.heads, s.head_dim).transpose(1, 2), pos + t)
            x = x + a.transpose(1, 2).reshape(b, t, -1) @ self.o[i].t()
            gate, up = (F.rms_norm(x, (s.hidden,), self.norm) @ self.gate_up[i].t()).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ self.down[i].t()
        logits = F.rms_norm(x[:, -1], (s.hidden,), self.norm) @ self.lm_head.t()
        return logits.argmax(-1)

    def gemms(self, x: torch.Tensor, attn: torch.Tensor, mlp: torch.Tensor,
              last: torch.Tensor) -> torch.Tensor:
        """The step's matrix products alone, on inputs of their shapes: per layer QKV
        (``x`` [B x T, hidden]), output (``attn`` [B x T, heads x head size]), gate/up
        (``x``) and down (``mlp`` [B x T, intermediate]); the LM head on ``last`` [B, hidden]."""
        for i in range(self.shape.layers):
            x @ self.qkv[i].t()
            attn @ self.o[i].t()
            x @ self.gate_up[i].t()
            mlp @ self.down[i].t()
        return last @ self.lm_head.t()

    def attention(self, q: torch.Tensor, keys: int) -> torch.Tensor:
        """The step's attention alone: per layer, ``q`` [B, heads, T, head size] over the
        first ``keys`` cached tokens of the first B sequences."""
        out = q
        for i in range(self.shape.layers):
            out = self._attend(i, q, keys)
        return out

    def _attend(self, layer: int, q: torch.Tensor, keys: int) -> torch.Tensor:
        """Causal when q holds more than one token (its last T of ``keys`` positions)."""
        b, t = q.shape[0], q.shape[2]
        k, v = self.k[layer, :b, :, :keys], self.v[layer, :b, :, :keys]
        return F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=True)
