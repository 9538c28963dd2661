"""The zoo's layers: torch modules whose ``reset_parameters`` seeds itself.

Every module here that owns parameters or buffers directly draws its values from its own
generator, seeded from ``(spec seed, qualified name)`` (:func:`seed_for`), so eager init and
meta-device init followed by ``reset_parameters()`` in any order give the same values (see
:mod:`suites.lib.shared.models`). Values are drawn in float32 whatever the default dtype,
then cast to the tensor's dtype; DTensors get their shard of the full value.
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor, nn

__all__ = [
    "BatchNorm",
    "Embedding",
    "LayerNorm",
    "Linear",
    "Scale",
    "Seeded",
    "fill",
    "normal",
    "seed_for",
    "uniform",
]


def seed_for(*parts: object) -> int:
    """A process-independent 31-bit seed from ``parts`` (Python's ``hash`` is salted)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


class Seeded:
    """Mixin: ``reset_parameters`` fills this module's own tensors from its init key."""

    _init_key: tuple[int, str] | None = None

    def _seed(self, key: tuple[int, str]) -> None:
        self._init_key = key
        self.reset_parameters()  # type: ignore[attr-defined]

    def _generator(self) -> torch.Generator | None:
        if self._init_key is None:  # called from the torch base class's __init__
            return None
        return torch.Generator().manual_seed(seed_for(*self._init_key))


def fill(target: Tensor, values: Tensor) -> None:
    """Copy full-shape CPU ``values`` into ``target`` (plain, DTensor or meta)."""
    if target.is_meta:
        return
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        if isinstance(target, DTensor):
            local = distribute_tensor(
                values.to(target.dtype),
                target.device_mesh,
                target.placements,
                src_data_rank=None,
            )
            target.copy_(local.to(target.device))
        else:
            target.copy_(values.to(device=target.device, dtype=target.dtype))


def normal(gen: torch.Generator, shape: torch.Size) -> Tensor:
    # always draw in float32: the stream must not depend on the default dtype (*-true inits)
    # on the generator's device (CPU), also under a CUDA default device (build_model on a GPU)
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=gen.device)


def uniform(gen: torch.Generator, shape: torch.Size, bound: float) -> Tensor:
    return (
        torch.rand(shape, generator=gen, dtype=torch.float32, device=gen.device) * 2 - 1
    ) * bound


class Linear(Seeded, nn.Linear):
    """``nn.Linear`` (so tensor-parallel styles accept it) with a seeded init."""

    def __init__(self, in_f: int, out_f: int, *, key: tuple[int, str], tied: bool = False):
        super().__init__(in_f, out_f)
        self.tied = tied  # the weight belongs to the Embedding: never re-initialize it here
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is None:
            return
        bound = self.in_features**-0.5
        weight = uniform(gen, self.weight.shape, bound)
        if not getattr(self, "tied", False):
            fill(self.weight, weight)
        fill(self.bias, uniform(gen, self.bias.shape, bound))


class Embedding(Seeded, nn.Embedding):
    """``nn.Embedding`` with a seeded init."""

    def __init__(self, num: int, dim: int, *, key: tuple[int, str]):
        super().__init__(num, dim)
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is not None:
            fill(self.weight, normal(gen, self.weight.shape) * 0.5)


class LayerNorm(Seeded, nn.LayerNorm):
    """``nn.LayerNorm`` with a seeded, non-trivial affine init (ones would hide swaps)."""

    def __init__(self, dim: int, *, key: tuple[int, str]):
        super().__init__(dim)
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is not None:
            fill(self.weight, 1 + 0.1 * normal(gen, self.weight.shape))
            fill(self.bias, 0.1 * normal(gen, self.bias.shape))


def norm_positions(dim: int) -> int:
    """The positions a :class:`BatchNorm` over ``dim`` features views each sample as: the
    smallest divisor of ``dim`` that is at least 3 (``dim`` itself when none is smaller).

    Each channel's statistics then cover at least 3 values even in a batch of one sample:
    BatchNorm refuses one value per channel in training, and two come out as ``(+1, -1)``
    times the weight whatever the input, so the gradient they pass back is rounding noise
    (as for a two-wide LayerNorm token: see ``scenarios._token_counts``).
    """
    return next(p for p in range(3, dim + 1) if dim % p == 0) if dim >= 3 else dim


class BatchNorm(Seeded, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` over ``(batch, dim)`` viewed as ``(batch, dim / positions,
    positions)`` (:func:`norm_positions`), with a seeded init.

    Its state is what real normalization layers carry: affine ``weight``/``bias``, two
    floating buffers (``running_mean``, ``running_var``) and an int64 counter
    (``num_batches_tracked``), all persistent, the buffers updated by every forward in
    training mode (momentum 0.1). The init is non-trivial, the counter included (as when
    fine-tuning from a pretrained model), so that a buffer rounded to a low dtype, swapped
    with another or reset on load changes a value the suites compare.
    """

    running_mean: Tensor
    running_var: Tensor
    num_batches_tracked: Tensor

    def __init__(self, dim: int, *, key: tuple[int, str]):
        self.positions = norm_positions(dim)
        super().__init__(dim // self.positions)
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is None:
            return
        shape = self.running_mean.shape
        fill(self.weight, 1 + 0.1 * normal(gen, self.weight.shape))
        fill(self.bias, 0.1 * normal(gen, self.bias.shape))
        fill(self.running_mean, 0.1 * normal(gen, shape))
        fill(self.running_var, 1 + uniform(gen, shape, 0.25))
        start = torch.randint(1, 10, (), generator=gen, device=gen.device)
        fill(self.num_batches_tracked, start.to(torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.unflatten(-1, (-1, self.positions))).flatten(-2)


class Scale(Seeded, nn.Module):
    """``x * scale * gate + offset``: a persistent buffer, a non-persistent buffer and a
    one-element parameter. ``seen_dtype`` records the buffer dtype used in the last forward."""

    scale: Tensor
    offset: Tensor

    def __init__(self, dim: int, *, key: tuple[int, str]):
        super().__init__()
        self.gate = nn.Parameter(torch.empty(1))
        self.register_buffer("scale", torch.empty(dim), persistent=True)
        self.register_buffer("offset", torch.empty(dim), persistent=False)
        self.seen_dtype = ""
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is not None:
            fill(self.gate, 1 + 0.1 * normal(gen, torch.Size([1])))
            fill(self.scale, 1 + 0.1 * normal(gen, self.scale.shape))
            fill(self.offset, 0.1 * normal(gen, self.offset.shape))

    def forward(self, x: Tensor) -> Tensor:
        self.seen_dtype = str(self.scale.dtype).replace("torch.", "")
        return x * self.scale * self.gate + self.offset
