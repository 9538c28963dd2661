"""The suites' model zoo: small models built deterministically from a :class:`ModelSpec`.

Every module that owns parameters or buffers directly seeds its own ``reset_parameters``
from ``(spec.seed, qualified name)``, so a model initialized eagerly and one created on the
meta device and materialized later (by FSDP1 unit by unit, or by ``to_empty`` on DTensors)
hold exactly the same values (see FINDINGS.md: stock ``nn.Linear`` init cannot give that).

The zoo looks like the models people shard: besides MLP blocks it has a tiny pre-norm
transformer block (:class:`AttentionBlock`: hand-written q/k/v/o attention or
``nn.MultiheadAttention``, rotary position tables held as non-persistent buffers), a
parameter owned by the root module itself (``ModelSpec.root_param``), a block called twice
in one forward (``ModelSpec.shared``) and tied input/output embeddings (``ModelSpec.tied``).

Inputs are ``(batch, features)``; an attention block splits each sample's hidden vector
into ``tokens`` tokens (``(B, hidden) -> (B, tokens, hidden / tokens)``) and attends among
the tokens of that sample only, so samples stay independent: the data-parallel ranks'
batches compose to the plain model's result exactly as for the MLP blocks.

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
    "ATTENTION_KINDS",
    "BLOCK_KINDS",
    "HEAD_DIM",
    "MODULE_CLASSES",
    "AttentionBlock",
    "Block",
    "BlockSpec",
    "Embedding",
    "HandAttention",
    "LayerNorm",
    "Linear",
    "MHAAttention",
    "ModelSpec",
    "NestedBlock",
    "Rotary",
    "Scale",
    "SeededMHA",
    "ZooModel",
    "build_model",
    "clean_name",
    "iter_param_owners",
    "make_batch",
    "module_class",
    "seed_for",
    "tp_widths",
]


def seed_for(*parts: object) -> int:
    """A process-independent 31-bit seed from ``parts`` (Python's ``hash`` is salted)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


#: width of one attention head (rotary position embedding rotates pairs of features)
HEAD_DIM = 2
BLOCK_KINDS = ("Block", "NestedBlock", "AttentionBlock")
ATTENTION_KINDS = ("hand", "mha")


@dataclass(frozen=True)
class BlockSpec:
    """One block of the trunk.

    Args:
        kind: ``"Block"`` (norm -> fc1 -> gelu -> fc2, residual), ``"NestedBlock"`` (a
            ``proj`` Linear followed by ``inner`` Blocks: nested wrap units) or
            ``"AttentionBlock"`` (pre-norm attention over each sample's tokens, then a
            pre-norm MLP, both residual).
        ffn: width of the MLP inside each Block (may be smaller than the world size).
        norm: whether each Block has a LayerNorm (an AttentionBlock: both of its norms).
        inner: number of inner Blocks of a NestedBlock (ignored for other kinds).
        attention: an AttentionBlock's attention: ``"hand"`` (``wq``/``wk``/``wv``/``wo``
            Linears, the tensor-parallel kind) or ``"mha"`` (``nn.MultiheadAttention``
            between a ``proj_in`` and a ``proj_out`` Linear).
        heads: attention heads of an AttentionBlock (each ``HEAD_DIM`` wide).
        tokens: tokens an AttentionBlock splits each sample's hidden vector into (must
            divide ``ModelSpec.hidden``).
    """

    kind: str = "Block"
    ffn: int = 8
    norm: bool = True
    inner: int = 0
    attention: str = "hand"
    heads: int = 1
    tokens: int = 1


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
        root_param: a ``gain`` parameter owned by the root module itself, multiplying the
            trunk's output (no wrap policy can select it: only the root unit holds it).
        shared: a ``shared`` Block (MLP width ``shared_ffn``) called twice in forward,
            before and after the trunk: one module, one set of parameters, two uses.
        shared_ffn: the shared Block's MLP width.
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
    root_param: bool = False
    shared: bool = False
    shared_ffn: int = 4
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
            if block.kind not in BLOCK_KINDS:
                raise ValueError(
                    f"BlockSpec.kind={block.kind!r} is not a zoo block; use one of "
                    f"{', '.join(repr(k) for k in BLOCK_KINDS)}."
                )
            if block.kind == "AttentionBlock":
                self._check_attention(block)

    def _check_attention(self, block: BlockSpec) -> None:
        if block.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"BlockSpec.attention={block.attention!r} is unknown; use 'hand' or 'mha'."
            )
        if block.heads < 1 or block.tokens < 1 or self.hidden % block.tokens:
            raise ValueError(
                f"BlockSpec(tokens={block.tokens}, heads={block.heads}) needs heads >= 1 and "
                f"tokens dividing hidden={self.hidden}; pick tokens among the divisors of "
                "hidden."
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


class Rotary(_Seeded, nn.Module):
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
        _fill(self.cos, angles.cos())
        _fill(self.sin, angles.sin())

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

    def __init__(self, width: int, spec: BlockSpec, *, seed: int, name: str):
        super().__init__()
        inner = spec.heads * HEAD_DIM
        for proj in ("wq", "wk", "wv"):
            setattr(self, proj, Linear(width, inner, key=(seed, f"{name}.{proj}")))
        self.wo = Linear(inner, width, key=(seed, f"{name}.wo"))
        self.rotary = Rotary(spec.tokens, key=(seed, f"{name}.rotary"))

    def forward(self, t: Tensor) -> Tensor:
        q, k, v = (getattr(self, p)(t).unflatten(-1, (-1, HEAD_DIM)) for p in ("wq", "wk", "wv"))
        return self.wo(_attend(self.rotary(q), self.rotary(k), v))


class SeededMHA(_Seeded, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` (batch first) with a seeded init; ``out_proj`` is a zoo
    :class:`Linear`. Its forward reads ``out_proj.weight`` directly and never calls
    ``out_proj`` (pytorch/pytorch#78109), so ``out_proj`` cannot be a wrap unit of its own."""

    def __init__(self, dim: int, heads: int, *, key: tuple[int, str]):
        super().__init__(dim, heads, batch_first=True)
        self.out_proj = Linear(dim, dim, key=(key[0], f"{key[1]}.out_proj"))
        self._seed(key)

    def reset_parameters(self) -> None:
        gen = self._generator()
        if gen is None:
            return
        bound = self.embed_dim**-0.5
        _fill(self.in_proj_weight, _uniform(gen, self.in_proj_weight.shape, bound))
        if self.in_proj_bias is not None:
            _fill(self.in_proj_bias, _uniform(gen, self.in_proj_bias.shape, bound))


class MHAAttention(nn.Module):
    """``proj_in`` -> rotary positions -> ``nn.MultiheadAttention`` -> ``proj_out``."""

    def __init__(self, width: int, spec: BlockSpec, *, seed: int, name: str):
        super().__init__()
        inner = spec.heads * HEAD_DIM
        self.proj_in = Linear(width, inner, key=(seed, f"{name}.proj_in"))
        self.rotary = Rotary(spec.tokens, key=(seed, f"{name}.rotary"))
        self.mha = SeededMHA(inner, spec.heads, key=(seed, f"{name}.mha"))
        self.proj_out = Linear(inner, width, key=(seed, f"{name}.proj_out"))

    def forward(self, t: Tensor) -> Tensor:
        h = self.rotary(self.proj_in(t).unflatten(-1, (-1, HEAD_DIM))).flatten(-2)
        out, _ = self.mha(h, h, h, need_weights=False)
        return self.proj_out(out)


class AttentionBlock(nn.Module):
    """A tiny pre-norm transformer block on ``(batch, hidden)``.

    Each sample's hidden vector is split into ``tokens`` tokens of width
    ``hidden / tokens``: ``t = t + attn(norm_attn(t))`` attends among one sample's tokens,
    then ``x + fc2(gelu(fc1(norm(x))))`` on the whole vector, as a :class:`Block`.
    """

    def __init__(self, hidden: int, spec: BlockSpec, *, seed: int, name: str):
        super().__init__()
        self.tokens = spec.tokens
        width = hidden // spec.tokens
        key = (seed, f"{name}.norm_attn")
        self.norm_attn = LayerNorm(width, key=key) if spec.norm else nn.Identity()
        kind = HandAttention if spec.attention == "hand" else MHAAttention
        self.attn = kind(width, spec, seed=seed, name=f"{name}.attn")
        self.norm = LayerNorm(hidden, key=(seed, f"{name}.norm")) if spec.norm else nn.Identity()
        self.fc1 = Linear(hidden, spec.ffn, key=(seed, f"{name}.fc1"))
        self.fc2 = Linear(spec.ffn, hidden, key=(seed, f"{name}.fc2"))

    def forward(self, x: Tensor) -> Tensor:
        t = x.unflatten(-1, (self.tokens, -1))
        x = (t + self.attn(self.norm_attn(t))).flatten(-2)
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ZooModel(_Seeded, nn.Module):
    """Input layer, optional shared Block, trunk of blocks, shared Block again, optional
    root ``gain``, optional Scale, head (optionally tied to the input)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        s = spec.seed
        if spec.vocab > 0:
            self.embed = Embedding(spec.vocab, spec.hidden, key=(s, "embed"))
        else:
            self.inp = Linear(spec.in_features, spec.hidden, key=(s, "inp"))
        if spec.shared:
            self.shared = Block(spec.hidden, spec.shared_ffn, True, seed=s, name="shared")
        self.blocks = nn.ModuleList(self._block(b, i) for i, b in enumerate(spec.blocks))
        if spec.root_param:
            self.gain = nn.Parameter(torch.empty(spec.hidden))
        if spec.scale:
            self.scale = Scale(spec.hidden, key=(s, "scale"))
        self.head = Linear(spec.hidden, spec.out, key=(s, "head"), tied=spec.tied)
        self._seed((s, "<root>"))
        self.tie_weights()
        for name, param in self.named_parameters():
            if name in spec.frozen:
                param.requires_grad_(False)

    def reset_parameters(self) -> None:
        """(Re)initialize the root's own parameter (``gain``), if any; children own theirs."""
        gen = self._generator()
        if gen is not None and self.spec.root_param:
            _fill(self.gain, 1 + 0.1 * _normal(gen, self.gain.shape))

    def _block(self, spec: BlockSpec, i: int) -> nn.Module:
        name = f"blocks.{i}"
        if spec.kind == "NestedBlock":
            return NestedBlock(self.spec.hidden, spec, seed=self.spec.seed, name=name)
        if spec.kind == "AttentionBlock":
            return AttentionBlock(self.spec.hidden, spec, seed=self.spec.seed, name=name)
        return Block(self.spec.hidden, spec.ffn, spec.norm, seed=self.spec.seed, name=name)

    def tie_weights(self) -> None:
        """Make ``head.weight`` the embedding's tensor (again, e.g. after ``to_empty``)."""
        if self.spec.tied:
            self.head.weight = self.embed.weight

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x) if self.spec.vocab > 0 else self.inp(x)
        if self.spec.shared:
            h = self.shared(h)
        for block in self.blocks:
            h = block(h)
        if self.spec.shared:
            h = self.shared(h)
        if self.spec.root_param:
            h = h * self.gain
        if self.spec.scale:
            h = self.scale(h)
        return self.head(h)


MODULE_CLASSES: dict[str, type[nn.Module]] = {
    cls.__name__: cls
    for cls in (
        Block,
        NestedBlock,
        AttentionBlock,
        HandAttention,
        MHAAttention,
        SeededMHA,
        Rotary,
        Scale,
        Linear,
        Embedding,
        LayerNorm,
        ZooModel,
    )
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


def tp_widths(spec: ModelSpec) -> list[int]:
    """The widths a tensor-parallel size must divide for the ``mlp`` plan to apply to
    ``spec``: every MLP width (the shared Block's too) and every hand-written attention's
    head count (``nn.MultiheadAttention`` stays out of the plan)."""
    widths = [block.ffn for block in spec.blocks]
    widths += [b.heads for b in spec.blocks if b.kind == "AttentionBlock" and b.attention == "hand"]
    return [*widths, spec.shared_ffn] if spec.shared else widths


def iter_param_owners(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Modules that own parameters or buffers directly (those whose init INIT-1 checks)."""
    for name, mod in model.named_modules():
        if any(True for _ in mod.parameters(recurse=False)) or any(
            True for _ in mod.buffers(recurse=False)
        ):
            yield clean_name(name), mod
