"""The zoo's attention layers: hand-written multi-head attention and
``nn.MultiheadAttention``, both with rotary positions held as non-persistent buffers.

Inputs are ``(batch, tokens, width)``: one sample's tokens attend to each other only (see
:class:`suites.lib.shared.models.AttentionBlock`, which makes the tokens). Heads are
``HEAD_DIM`` wide.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from suites.lib.shared.layers import Linear, Seeded, fill, uniform

__all__ = ["HEAD_DIM", "HandAttention", "MHAAttention", "Rotary", "SeededMHA"]

#: width of one attention head (rotary position embedding rotates pairs of features)
HEAD_DIM = 2


class Rotary(Seeded, nn.Module):
    """Rotary position tables of ``tokens`` positions, as two non-persistent buffers.

    ``cos``/``sin`` (``tokens x HEAD_DIM // 2``) are computed from the shape alone, never
    saved: :meth:`reset_parameters` recomputes them, so they are right after meta-device
    init and materialization (``to_empty`` leaves garbage in every buffer).
    """

    cos: Tensor
    sin: Tensor

    def __init__(self, tokens: int, *, key: tuple[int, str]):
        super().__init__()
        self.register_buffer("cos", torch.empty(tokens, HEAD_DIM // 2), persistent=False)
        self.register_buffer("sin", torch.empty(tokens, HEAD_DIM // 2), persistent=False)
        self._seed(key)

    def reset_parameters(self) -> None:
        if self._init_key is None:
            return
        tokens = self.cos.shape[0]
        inv_freq = 10.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        angles = torch.outer(torch.arange(tokens, dtype=torch.float32) + 1, inv_freq)
        fill(self.cos, angles.cos())
        fill(self.sin, angles.sin())

    def forward(self, x: Tensor) -> Tensor:
        """Rotate ``x`` of shape ``(batch, tokens, heads, HEAD_DIM)`` by position."""
        cos = self.cos.to(x.dtype)[:, None, :]
        sin = self.sin.to(x.dtype)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)


def _attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Softmax attention within each sample: ``(B, T, H, D)`` in, ``(B, T, H * D)`` out."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    weights = torch.softmax(q @ k.transpose(-1, -2) * HEAD_DIM**-0.5, dim=-1)
    return (weights @ v).transpose(1, 2).flatten(2)


class HandAttention(nn.Module):
    """Hand-written multi-head attention: ``wq``/``wk``/``wv``/``wo`` Linears and rotary
    positions on q and k.

    Heads are read from the projections' width (``unflatten(-1, (-1, HEAD_DIM))``), so a
    tensor-parallel plan that splits ``wq``/``wk``/``wv`` column-wise (whole heads per
    rank) and ``wo`` row-wise runs the same code on each rank's heads.
    """

    def __init__(self, width: int, heads: int, tokens: int, *, seed: int, name: str):
        super().__init__()
        inner = heads * HEAD_DIM
        for proj in ("wq", "wk", "wv"):
            setattr(self, proj, Linear(width, inner, key=(seed, f"{name}.{proj}")))
        self.wo = Linear(inner, width, key=(seed, f"{name}.wo"))
        self.rotary = Rotary(tokens, key=(seed, f"{name}.rotary"))

    def forward(self, t: Tensor) -> Tensor:
        q, k, v = (getattr(self, p)(t).unflatten(-1, (-1, HEAD_DIM)) for p in ("wq", "wk", "wv"))
        return self.wo(_attend(self.rotary(q), self.rotary(k), v))


class SeededMHA(Seeded, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` (batch first) with a seeded init; ``out_proj`` is a zoo
    :class:`Linear`. Its forward reads ``out_proj.weight`` directly and never calls
    ``out_proj`` (pytorch/pytorch#78109), so ``out_proj`` cannot be a wrap unit of its own."""

    def __init__(self, dim: int, heads: int, *, key: tuple[int, str]):
        super().__init__(dim, heads, batch_first=True)
        self.out_proj = Linear(dim, dim, key=(key[0], f"{key[1]}.out_proj"))  # type: ignore[assignment]  # a Linear too
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is None:
            return
        bound = self.embed_dim**-0.5
        fill(self.in_proj_weight, uniform(gen, self.in_proj_weight.shape, bound))
        if self.in_proj_bias is not None:
            fill(self.in_proj_bias, uniform(gen, self.in_proj_bias.shape, bound))


class MHAAttention(nn.Module):
    """``proj_in`` -> rotary positions -> ``nn.MultiheadAttention`` -> ``proj_out``."""

    def __init__(self, width: int, heads: int, tokens: int, *, seed: int, name: str):
        super().__init__()
        inner = heads * HEAD_DIM
        self.proj_in = Linear(width, inner, key=(seed, f"{name}.proj_in"))
        self.rotary = Rotary(tokens, key=(seed, f"{name}.rotary"))
        self.mha = SeededMHA(inner, heads, key=(seed, f"{name}.mha"))
        self.proj_out = Linear(inner, width, key=(seed, f"{name}.proj_out"))

    def forward(self, t: Tensor) -> Tensor:
        h = self.rotary(self.proj_in(t).unflatten(-1, (-1, HEAD_DIM))).flatten(-2)
        out, _ = self.mha(h, h, h, need_weights=False)
        return self.proj_out(out)
