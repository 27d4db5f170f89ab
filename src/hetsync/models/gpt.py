"""A small causal transformer over characters, after nanoGPT (Karpathy 2022, ``model.py``),
itself GPT-2's layout (Radford et al. 2019).

1. token embedding + learned position embedding (context positions);
2. ``n_layer`` pre-norm blocks: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)), the
   attention causal over ``n_head`` heads (torch's ``scaled_dot_product_attention``), the MLP
   4·n_embd wide with GELU;
3. a final LayerNorm and a linear head whose weight is the token embedding's (weight tying).

Departures: no dropout and no biases (nanoGPT's CPU recipe sets dropout 0; its ``bias=False``
option); the logits come out as ``(B, vocab, T)``, the class-second layout that
``torch.nn.functional.cross_entropy`` takes for a sequence, so the training loop's loss and the
evaluation's counts are the image models' unchanged. Weights are initialised as nanoGPT does:
normal(0, 0.02), and the projections into the residual stream scaled by 1/sqrt(2·n_layer).
nanoGPT's CPU setting (4 layers, 4 heads, 128 wide, context 64) with Shakespeare's 85 symbols
has 0.81 M parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .registry import register

__all__ = ["GPTOptions", "CharGPT"]


@dataclass(frozen=True)
class GPTOptions:
    """The transformer's size (``--n-layer``, ``--n-head``, ``--n-embd``)."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")


class _Block(nn.Module):
    def __init__(self, o: GPTOptions):
        super().__init__()
        self.n_head = o.n_head
        self.ln_1 = nn.LayerNorm(o.n_embd, bias=False)
        self.qkv = nn.Linear(o.n_embd, 3 * o.n_embd, bias=False)
        self.attn_proj = nn.Linear(o.n_embd, o.n_embd, bias=False)
        self.ln_2 = nn.LayerNorm(o.n_embd, bias=False)
        self.fc = nn.Linear(o.n_embd, 4 * o.n_embd, bias=False)
        self.mlp_proj = nn.Linear(4 * o.n_embd, o.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x))))


class CharGPT(nn.Module):
    """See the module docstring. Input: int64 token ids ``(B, T)`` with T ≤ context."""

    def __init__(self, context: int, vocab: int, options: GPTOptions = GPTOptions()):
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, options.n_embd)
        self.wpe = nn.Embedding(context, options.n_embd)
        self.blocks = nn.ModuleList(_Block(options) for _ in range(options.n_layer))
        self.ln_f = nn.LayerNorm(options.n_embd, bias=False)
        self.head = nn.Linear(options.n_embd, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scale = 1 / math.sqrt(2 * options.n_layer) if name.endswith("proj.weight") else 1
                nn.init.normal_(p, 0.0, 0.02 * scale)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"CharGPT: a sequence of {t} tokens is longer than its context {self.context}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)).transpose(1, 2)


@register("gpt-char", inputs="tokens")
def gpt_char(input_shape: tuple[int], num_classes: int, **options) -> nn.Module:
    return CharGPT(input_shape[0], num_classes, GPTOptions(**options))
