"""The suites' model zoo: small models built deterministically from a :class:`ModelSpec`.

Every module that owns parameters or buffers directly seeds its own ``reset_parameters``
from ``(spec.seed, qualified name)``, so a model initialized eagerly and one created on the
meta device and materialized later (by FSDP1 unit by unit, or by ``to_empty`` on DTensors)
hold exactly the same values (stock ``nn.Linear`` init cannot give that: FSDP1 materializes
wrap units bottom-up, and DTensor random ops on CPU do not replay the CPU generator).

The zoo looks like the models people shard: besides MLP blocks it has a tiny pre-norm
transformer block (:class:`AttentionBlock`: hand-written q/k/v/o attention or
``nn.MultiheadAttention``, rotary position tables held as non-persistent buffers), a
parameter owned by the root module itself (``ModelSpec.root_param``), a block called twice
in one forward (``ModelSpec.shared``), tied input/output embeddings (``ModelSpec.tied``) and
a BatchNorm whose running statistics every training forward updates
(``ModelSpec.running_stats``: two float buffers and an int64 counter).

Inputs are ``(batch, features)``; an attention block splits each sample's hidden vector
into ``tokens`` tokens (``(B, hidden) -> (B, tokens, hidden / tokens)``) and attends among
the tokens of that sample only, so samples stay independent: the data-parallel ranks'
batches compose to the plain model's result exactly as for the MLP blocks.

The layers live in :mod:`suites.lib.shared.layers` (seeded ``Linear``, ``Embedding``,
``LayerNorm``, ``BatchNorm``, ``Scale``) and :mod:`suites.lib.shared.attention` (attention
and rotary tables); this module builds the blocks and the model from them and re-exports
them.

The module classes carry stable names (``Block``, ``NestedBlock``, ``Scale``, ...) because
wrap and checkpointing policies select modules by class; scenarios refer to them by name
and :func:`module_class` turns a name back into the class on the ranks. Two block kinds test
what "each instance of those classes" means (WRAP-1, FSDP2-1, AC-1; :data:`LOOKALIKE_KINDS`):
:class:`ScaledBlock`, a subclass of ``Block`` that a policy listing ``Block`` selects, and
``ForeignBlock``, a class also called ``Block`` from another module
(:mod:`suites.lib.shared.lookalike`) that it does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from suites.lib.shared import lookalike
from suites.lib.shared.attention import HEAD_DIM, HandAttention, MHAAttention, Rotary, SeededMHA
from suites.lib.shared.layers import (
    BatchNorm,
    Embedding,
    LayerNorm,
    Linear,
    Scale,
    Seeded,
    fill,
    normal,
    seed_for,
)

__all__ = [
    "ATTENTION_KINDS",
    "BLOCK_KINDS",
    "HEAD_DIM",
    "LOOKALIKE_KINDS",
    "MODULE_CLASSES",
    "AttentionBlock",
    "BatchNorm",
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
    "ScaledBlock",
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


#: the block kinds the suites' models draw from
BLOCK_KINDS = ("Block", "NestedBlock", "AttentionBlock")
#: block kinds a policy of classes must tell apart from ``Block`` (WRAP-1, FSDP2-1, AC-1): a
#: subclass of it (:class:`ScaledBlock`) and another module's class of the same name
#: (:class:`suites.lib.shared.lookalike.Block`); only the checks of those clauses draw them
LOOKALIKE_KINDS = ("ScaledBlock", "ForeignBlock")
ATTENTION_KINDS = ("hand", "mha")


@dataclass(frozen=True)
class BlockSpec:
    """One block of the trunk.

    Args:
        kind: ``"Block"`` (norm -> fc1 -> gelu -> fc2, residual), ``"NestedBlock"`` (a
            ``proj`` Linear followed by ``inner`` Blocks: nested wrap units),
            ``"AttentionBlock"`` (pre-norm attention over each sample's tokens, then a
            pre-norm MLP, both residual), ``"ScaledBlock"`` (a Block subclass) or
            ``"ForeignBlock"`` (another module's class named ``Block``; no norm).
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
        running_stats: a ``bn`` :class:`~suites.lib.shared.layers.BatchNorm` right after the
            input layer (running mean and variance, an int64 counter, updated by every
            training forward); the inputs of such a model are the same on every
            data-parallel rank (see :func:`make_batch`).
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
    running_stats: bool = False
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
            if block.kind not in (*BLOCK_KINDS, *LOOKALIKE_KINDS):
                raise ValueError(
                    f"BlockSpec.kind={block.kind!r} is not a zoo block; use one of "
                    f"{', '.join(repr(k) for k in (*BLOCK_KINDS, *LOOKALIKE_KINDS))}."
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


class Block(nn.Module):
    """Pre-norm residual MLP: ``x + fc2(gelu(fc1(norm(x))))``."""

    def __init__(self, hidden: int, ffn: int, norm: bool, *, seed: int, name: str):
        super().__init__()
        self.norm = LayerNorm(hidden, key=(seed, f"{name}.norm")) if norm else nn.Identity()
        self.fc1 = Linear(hidden, ffn, key=(seed, f"{name}.fc1"))
        self.fc2 = Linear(ffn, hidden, key=(seed, f"{name}.fc2"))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ScaledBlock(Block):
    """A :class:`Block` subclass that halves its residual branch: an instance of a subclass
    of ``Block``, which a policy listing ``Block`` selects."""

    def forward(self, x: Tensor) -> Tensor:
        return x + 0.5 * self.fc2(F.gelu(self.fc1(self.norm(x))))


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
        self.attn = kind(width, spec.heads, spec.tokens, seed=seed, name=f"{name}.attn")
        self.norm = LayerNorm(hidden, key=(seed, f"{name}.norm")) if spec.norm else nn.Identity()
        self.fc1 = Linear(hidden, spec.ffn, key=(seed, f"{name}.fc1"))
        self.fc2 = Linear(spec.ffn, hidden, key=(seed, f"{name}.fc2"))

    def forward(self, x: Tensor) -> Tensor:
        t = x.unflatten(-1, (self.tokens, -1))
        x = (t + self.attn(self.norm_attn(t))).flatten(-2)
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ZooModel(Seeded, nn.Module):
    """Input layer, optional BatchNorm, optional shared Block, trunk of blocks, shared Block
    again, optional root ``gain``, optional Scale, head (optionally tied to the input)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        s = spec.seed
        if spec.vocab > 0:
            self.embed = Embedding(spec.vocab, spec.hidden, key=(s, "embed"))
        else:
            self.inp = Linear(spec.in_features, spec.hidden, key=(s, "inp"))
        if spec.running_stats:
            self.bn = BatchNorm(spec.hidden, key=(s, "bn"))
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
            fill(self.gain, 1 + 0.1 * normal(gen, self.gain.shape))

    def _block(self, spec: BlockSpec, i: int) -> nn.Module:
        name = f"blocks.{i}"
        if spec.kind == "NestedBlock":
            return NestedBlock(self.spec.hidden, spec, seed=self.spec.seed, name=name)
        if spec.kind == "AttentionBlock":
            return AttentionBlock(self.spec.hidden, spec, seed=self.spec.seed, name=name)
        if spec.kind == "ForeignBlock":
            return lookalike.Block(self.spec.hidden, spec.ffn, seed=self.spec.seed, name=name)
        kind = ScaledBlock if spec.kind == "ScaledBlock" else Block
        return kind(self.spec.hidden, spec.ffn, spec.norm, seed=self.spec.seed, name=name)

    def tie_weights(self) -> None:
        """Make ``head.weight`` the embedding's tensor (again, e.g. after ``to_empty``)."""
        if self.spec.tied:
            self.head.weight = self.embed.weight

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x) if self.spec.vocab > 0 else self.inp(x)
        if self.spec.running_stats:
            h = self.bn(h)
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
        ScaledBlock,
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
        BatchNorm,
        ZooModel,
    )
}


def module_class(name: str) -> type[nn.Module]:
    """The zoo class called ``name`` (policies are described by class names; ``Block`` is
    :class:`Block`, never :class:`suites.lib.shared.lookalike.Block`)."""
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

    [Note: running statistics see the same inputs on every rank] A BatchNorm updates its
    running statistics from the batch it normalizes, and a sharded strategy does not
    synchronize buffers (FSDP neither broadcasts nor reduces them): with inputs of their
    own, the data-parallel ranks would end with running statistics of their own, no
    checkpoint (which holds one copy) could equal every rank's state, and no plain model
    could be the reference. For a model with ``running_stats``, ``x`` is therefore drawn
    without ``dp_rank``, the same on every rank, while ``y`` is still each rank's own, so
    the gradients still differ between ranks and their reduction is still checked. The
    plain reference counts one update per micro-batch, as each rank does
    (:func:`suites.lib.controller.oracles.reference_run`).
    """
    gen = torch.Generator().manual_seed(seed_for(data_seed, "data", step, micro, dp_rank))
    if spec.running_stats:  # see the note above: x from a generator every rank shares
        shared = torch.Generator().manual_seed(seed_for(data_seed, "data", step, micro, "x"))
        x = _inputs(spec, shared, batch_size)
        return x, torch.randn(batch_size, spec.out, generator=gen, dtype=torch.float32)
    x = _inputs(spec, gen, batch_size)
    y = torch.randn(batch_size, spec.out, generator=gen, dtype=torch.float32)
    return x, y


def _inputs(spec: ModelSpec, gen: torch.Generator, batch_size: int) -> Tensor:
    if spec.vocab > 0:
        return torch.randint(0, spec.vocab, (batch_size,), generator=gen)
    return torch.randn(batch_size, spec.in_features, generator=gen, dtype=torch.float32)


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
