"""FSDP2's collectives, read out of a hung rank's stack: which one, and which hook ran it.

FSDP2 (``torch.distributed.fsdp.fully_shard``) enters its collectives from its own hooks:
the parameters' all-gather (``foreach_all_gather``) from ``pre_forward`` and ``pre_backward``
(or an explicit ``FSDPModule.unshard``), the gradients' reduce-scatter, and for HSDP their
all-reduce (``foreach_reduce``), from ``post_backward``. A rank left waiting there shows
one of two stacks:

- the c10d call itself (``all_gather_single`` under ``foreach_all_gather``: torch 2.13 on
  gloo issues it synchronously), which :func:`harness.verdicts.collectives.waiting_collective`
  sees as a c10d collective; what it adds from here is that FSDP2 entered it, and from which
  hook;
- the wait for an asynchronous one (``work.wait()`` in ``foreach_all_gather_copy_out``,
  ``wait_for_unshard``, ``finalize_backward``: NCCL, and releases that issue the all-gather
  with ``async_op``), with no c10d frame on the stack at all; that is a collective too.

:func:`fsdp2_collective` reads both from the frames of one thread. The function names are
torch's private ones (``torch/distributed/fsdp/_fully_shard/``), as torch 2.13 has them; a
release that renames them leaves the first kind named by its c10d call as before, and the
second unnamed ("no collective", as before this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FSDP2Collective", "fsdp2_collective"]

#: the folder of FSDP2's modules inside torch
_FSDP2_DIR = "/distributed/fsdp/_fully_shard/"
#: FSDP2's functions that issue or wait for a collective, and which collective that is
_WHAT = {
    "foreach_all_gather": "all-gather",
    "foreach_all_gather_copy_out": "all-gather",
    "wait_for_unshard": "all-gather",
    "foreach_reduce": "reduce-scatter",
    "finalize_backward": "reduce-scatter",
    "_wait_for_post_backward": "reduce-scatter",
}
#: of those, the ones that wait for a collective issued before (no c10d frame under them)
_WAITS = frozenset({"foreach_all_gather_copy_out", "wait_for_unshard", "finalize_backward"})
#: FSDP2's hooks and methods that run its collectives, the one a verdict names first (a
#: forward's all-gather runs in ``unshard`` under ``pre_forward``: it names ``pre_forward``)
_HOOKS = (
    "pre_forward",
    "pre_backward",
    "post_backward",
    "_prefetch_unshard",
    "unshard",
    "lazy_init",
    "_root_post_backward_final_callback",
)


@dataclass(frozen=True)
class FSDP2Collective:
    """An FSDP2 collective a rank waits in.

    Args:
        what: ``all-gather`` or ``reduce-scatter`` (``all-reduce`` when the c10d call under
            ``foreach_reduce`` is one: HSDP's replicas).
        function: FSDP2's function that issued or waits for it (``foreach_all_gather``).
        hook: FSDP2's hook or method that ran it (``pre_forward``), or ``""``.
    """

    what: str
    function: str
    hook: str = ""

    def describe(self, c10d_op: str = "") -> str:
        """``FSDP2 all-gather (foreach_all_gather in pre_forward; c10d all_gather_single)``:
        the collective, FSDP2's function and hook, and the c10d call when there is one."""
        where = f" in {self.hook}" if self.hook else ""
        call = f"; c10d {c10d_op}" if c10d_op else ""
        return f"FSDP2 {self.what} ({self.function}{where}{call})"


def _is_fsdp2(filename: str) -> bool:
    return _FSDP2_DIR in filename.replace("\\", "/")


def fsdp2_collective(
    frames: Sequence[tuple[str, str]], c10d_op: str = ""
) -> FSDP2Collective | None:
    """The FSDP2 collective one thread's frames show it in, or ``None``.

    Args:
        frames: ``(file, function)`` of the thread's frames, innermost first (as
            faulthandler writes them).
        c10d_op: the c10d or functional collective found on the same frames (``""``: none;
            then only a frame that waits for an issued collective counts, and it must be
            the innermost frame outside torch's own helpers).
    """
    for index, (file, name) in enumerate(frames):
        if not _is_fsdp2(file) or name not in _WHAT:
            continue
        if not c10d_op and not _waits_here(frames, index):
            return None
        what = "all-reduce" if name == "foreach_reduce" and "all_reduce" in c10d_op else _WHAT[name]
        outside = {n for f, n in frames[index + 1 :] if _is_fsdp2(f)}
        hook = next((h for h in _HOOKS if h in outside), "")
        return FSDP2Collective(what, name, hook)
    return None


def _waits_here(frames: Sequence[tuple[str, str]], index: int) -> bool:
    """Whether frame ``index`` waits for an issued collective: one of the waiting functions,
    with only torch's helpers inside it (a ``Work.wait`` or ``Event.synchronize`` wrapper),
    none of FSDP2's own (its copy-out computes)."""
    if frames[index][1] not in _WAITS:
        return False
    inside = [f.replace("\\", "/") for f, _ in frames[:index]]
    return all("/torch/" in f and not _is_fsdp2(f) for f in inside)
