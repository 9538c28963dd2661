"""The suites' model zoo: small models built deterministically from a :class:`ModelSpec`.

Every module that owns parameters or buffers directly seeds its own ``reset_parameters``
from ``(spec.seed, qualified name)``, so a model initialized eagerly and one created on the
meta device and materialized later (by FSDP1 unit by unit, or by ``to_empty`` on DTensors)
hold exactly the same values (see FINDINGS.md: stock ``nn.Linear`` init cannot give that).

The module classes carry stable names (``Block``, ``NestedBlock``, ``Scale``, ...) because
wrap and checkpointing policies select modules by class; scenarios refer to them by name
and :func:`module_class` turns a name back into the class on the ranks.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "MODULE_CLASSES",
    "Block",
    "BlockSpec",
    "Embedding",
    "LayerNorm",
    "Linear",
    "ModelSpec",
    "NestedBlock",
    "Scale",
    "ZooModel",
    "build_model",
    "clean_name",
    "iter_param_owners",
    "make_batch",
    "module_class",
    "seed_for",
]


def seed_for(*parts: object) -> int:
    """A process-independent 31-bit seed from ``parts`` (Python's ``hash`` is salted)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class BlockSpec:
    """One block of the trunk.

    Args:
        kind: ``"Block"`` (norm -> fc1 -> gelu -> fc2, residual) or ``"NestedBlock"``
            (a ``proj`` Linear followed by ``inner`` Blocks: nested wrap units).
        ffn: width of the MLP inside each Block (may be smaller than the world size).
        norm: whether each Block has a LayerNorm.
        inner: number of inner Blocks of a NestedBlock (ignored for a Block).
    """

    kind: str = "Block"
    ffn: int = 8
    norm: bool = True
    inner: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """A model tree, as data.

    Args:
        hidden: width of the residual stream.
        blocks: the trunk.
        vocab: > 0 for an ``embed`` Embedding on integer inputs, 0 for an ``inp`` Linear on
            float features of width ``in_features``.
        in_features: input width when ``vocab == 0``.
        out: output width of the ``head`` Linear (must equal ``vocab`` when ``tied``).
        tied: ``head.weight`` is ``embed.weight`` (one tensor).
        scale: a ``Scale`` module with a persistent buffer, a non-persistent buffer and a
            one-element parameter (smaller than any world size > 1).
        frozen: qualified names of parameters with ``requires_grad=False``.
        seed: seeds every module's ``reset_parameters``.
    """

    hidden: int = 6
    blocks: tuple[BlockSpec, ...] = (BlockSpec(),)
    vocab: int = 0
    in_features: int = 5
    out: int = 3
    tied: bool = False
    scale: bool = True
    frozen: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tied and (self.vocab <= 0 or self.out != self.vocab):
            raise ValueError(
                f"ModelSpec(tied=True) needs vocab > 0 and out == vocab, got vocab={self.vocab}"
                f" and out={self.out}; set out=vocab or tied=False."
            )
        if self.hidden < 1 or self.out < 1:
            raise ValueError(f"ModelSpec needs hidden >= 1 and out >= 1, got {self}.")
        for block in self.blocks:
            if block.kind not in ("Block", "NestedBlock"):
                raise ValueError(
                    f"BlockSpec.kind={block.kind!r} is not a zoo block; use 'Block' or "
                    "'NestedBlock'."
                )


class _Seeded:
    """Mixin: ``reset_parameters`` fills this module's own tensors from its init key."""

    _init_key: tuple[int, str] | None = None

    def _seed(self, key: tuple[int, str]) -> None:
        self._init_key = key
        self.reset_parameters()  # type: ignore[attr-defined]

    def _generator(self) -> torch.Generator | None:
        if self._init_key is None:  # called from the torch base class's __init__
            return None
        return torch.Generator().manual_seed(seed_for(*self._init_key))


def _fill(target: Tensor, values: Tensor) -> None:
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


def _normal(gen: torch.Generator, shape: torch.Size) -> Tensor:
    # always draw in float32: the stream must not depend on the default dtype (*-true inits)
    return torch.randn(shape, generator=gen, dtype=torch.float32)


def _uniform(gen: torch.Generator, shape: torch.Size, bound: float) -> Tensor:
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1) * bound


class Linear(_Seeded, nn.Linear):
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
        weight = _uniform(gen, self.weight.shape, bound)
        if not getattr(self, "tied", False):
            _fill(self.weight, weight)
        _fill(self.bias, _uniform(gen, self.bias.shape, bound))


class Embedding(_Seeded, nn.Embedding):
    """``nn.Embedding`` with a seeded init."""

    def __init__(self, num: int, dim: int, *, key: tuple[int, str]):
        super().__init__(num, dim)
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is not None:
            _fill(self.weight, _normal(gen, self.weight.shape) * 0.5)


class LayerNorm(_Seeded, nn.LayerNorm):
    """``nn.LayerNorm`` with a seeded, non-trivial affine init (ones would hide swaps)."""

    def __init__(self, dim: int, *, key: tuple[int, str]):
        super().__init__(dim)
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is not None:
            _fill(self.weight, 1 + 0.1 * _normal(gen, self.weight.shape))
            _fill(self.bias, 0.1 * _normal(gen, self.bias.shape))


class Scale(_Seeded, nn.Module):
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
            _fill(self.gate, 1 + 0.1 * _normal(gen, torch.Size([1])))
            _fill(self.scale, 1 + 0.1 * _normal(gen, self.scale.shape))
            _fill(self.offset, 0.1 * _normal(gen, self.offset.shape))

    def forward(self, x: Tensor) -> Tensor:
        self.seen_dtype = str(self.scale.dtype).replace("torch.", "")
        return x * self.scale * self.gate + self.offset


class Block(nn.Module):
    """Pre-norm residual MLP: ``x + fc2(gelu(fc1(norm(x))))``."""

    def __init__(self, hidden: int, ffn: int, norm: bool, *, seed: int, name: str):
        super().__init__()
        self.norm = LayerNorm(hidden, key=(seed, f"{name}.norm")) if norm else nn.Identity()
        self.fc1 = Linear(hidden, ffn, key=(seed, f"{name}.fc1"))
        self.fc2 = Linear(ffn, hidden, key=(seed, f"{name}.fc2"))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class NestedBlock(nn.Module):
    """``proj`` followed by inner Blocks: a wrap unit that contains wrap units."""

    def __init__(self, hidden: int, spec: BlockSpec, *, seed: int, name: str):
        super().__init__()
        self.proj = Linear(hidden, hidden, key=(seed, f"{name}.proj"))
        self.inner = nn.ModuleList(
            Block(hidden, spec.ffn, spec.norm, seed=seed, name=f"{name}.inner.{i}")
            for i in range(max(spec.inner, 1))
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.proj(x)
        for block in self.inner:
            x = block(x)
        return x


class ZooModel(nn.Module):
    """Input layer, trunk of blocks, optional Scale, head (optionally tied to the input)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        s = spec.seed
        if spec.vocab > 0:
            self.embed = Embedding(spec.vocab, spec.hidden, key=(s, "embed"))
        else:
            self.inp = Linear(spec.in_features, spec.hidden, key=(s, "inp"))
        self.blocks = nn.ModuleList(self._block(b, i) for i, b in enumerate(spec.blocks))
        if spec.scale:
            self.scale = Scale(spec.hidden, key=(s, "scale"))
        self.head = Linear(spec.hidden, spec.out, key=(s, "head"), tied=spec.tied)
        self.tie_weights()
        for name, param in self.named_parameters():
            if name in spec.frozen:
                param.requires_grad_(False)

    def _block(self, spec: BlockSpec, i: int) -> nn.Module:
        name = f"blocks.{i}"
        if spec.kind == "NestedBlock":
            return NestedBlock(self.spec.hidden, spec, seed=self.spec.seed, name=name)
        return Block(self.spec.hidden, spec.ffn, spec.norm, seed=self.spec.seed, name=name)

    def tie_weights(self) -> None:
        """Make ``head.weight`` the embedding's tensor (again, e.g. after ``to_empty``)."""
        if self.spec.tied:
            self.head.weight = self.embed.weight

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x) if self.spec.vocab > 0 else self.inp(x)
        for block in self.blocks:
            h = block(h)
        if self.spec.scale:
            h = self.scale(h)
        return self.head(h)


MODULE_CLASSES: dict[str, type[nn.Module]] = {
    cls.__name__: cls for cls in (Block, NestedBlock, Scale, Linear, Embedding, LayerNorm, ZooModel)
}


def module_class(name: str) -> type[nn.Module]:
    """The zoo class called ``name`` (policies are described by class names)."""
    try:
        return MODULE_CLASSES[name]
    except KeyError:
        raise ValueError(
            f"module class {name!r} is not in the zoo; use one of {sorted(MODULE_CLASSES)}."
        ) from None


def build_model(spec: ModelSpec, device: torch.device | str | None = None) -> ZooModel:
    """Build the model of ``spec`` (on ``device``, or the ambient default device/dtype)."""
    if device is None:
        return ZooModel(spec)
    with torch.device(device):
        return ZooModel(spec)


_WRAPPER_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod", "module")


def clean_name(name: str) -> str:
    """A qualified name without wrapper segments (FSDP1, checkpoint wrapper, compile)."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS[:3]]
    return ".".join(parts)


def make_batch(
    spec: ModelSpec, data_seed: int, step: int, micro: int, dp_rank: int, batch_size: int
) -> tuple[Tensor, Tensor]:
    """Inputs and targets of one micro-batch of one data-parallel rank (CPU, deterministic).

    Returns:
        ``(x, y)``: ``x`` is int64 token ids ``(batch_size,)`` when ``spec.vocab > 0``, else
        float32 ``(batch_size, in_features)``; ``y`` is float32 ``(batch_size, out)``.
    """
    gen = torch.Generator().manual_seed(seed_for(data_seed, "data", step, micro, dp_rank))
    if spec.vocab > 0:
        x = torch.randint(0, spec.vocab, (batch_size,), generator=gen)
    else:
        x = torch.randn(batch_size, spec.in_features, generator=gen, dtype=torch.float32)
    y = torch.randn(batch_size, spec.out, generator=gen, dtype=torch.float32)
    return x, y


def iter_param_owners(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Modules that own parameters or buffers directly (those whose init INIT-1 checks)."""
    for name, mod in model.named_modules():
        if any(True for _ in mod.parameters(recurse=False)) or any(
            True for _ in mod.buffers(recurse=False)
        ):
            yield clean_name(name), mod
