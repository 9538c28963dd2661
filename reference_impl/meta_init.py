"""Materializing meta-device modules (CONTRACT.md API-3, INIT-1), shared by both families.

The contract: after ``setup_module`` every module that directly owns parameters or buffers
has had its ``reset_parameters()`` called exactly once on real storage, and parameters that
were tied (one ``Parameter`` in several places) are tied again. ``Module.to_empty`` gives each
place its own tensor, so the ties are recorded before materializing and restored after.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
from torch import nn

__all__ = [
    "MetaMaterializer",
    "has_meta_tensors",
    "owns_state",
    "retie_parameters",
    "tied_parameter_groups",
]

Slot = tuple[nn.Module, str]


def has_meta_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` (recursively) is on the meta device."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def owns_state(module: nn.Module) -> bool:
    """Whether ``module`` directly owns a parameter or a buffer."""
    return any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )


def tied_parameter_groups(root: nn.Module) -> list[list[Slot]]:
    """Slots ``(module, name)`` that hold the same ``Parameter``, first slot first.

    The first slot, in ``named_modules`` order, is the canonical one: after materialization
    the others point at its parameter (the usual ``head.weight = embed.weight`` convention).
    """
    by_param: dict[int, list[Slot]] = {}
    for module in root.modules():
        for name, param in module._parameters.items():
            if param is not None:
                by_param.setdefault(id(param), []).append((module, name))
    return [slots for slots in by_param.values() if len(slots) > 1]


def retie_parameters(groups: Iterable[list[Slot]]) -> None:
    """Point every slot of each group at the parameter of the group's first slot."""
    for (module, name), *aliases in groups:
        param = module._parameters[name]
        for alias_module, alias_name in aliases:
            alias_module._parameters[alias_name] = param


class MetaMaterializer:
    """Materialize a meta-device model module by module; usable as FSDP1 ``param_init_fn``.

    FSDP1 calls it on every module of a unit just before flattening the unit (bottom-up for
    nested units). Each call allocates the module's own parameters and buffers on ``device``
    (``to_empty(recurse=False)``), calls its ``reset_parameters()`` once, and re-ties any tied
    parameter whose canonical slot is already materialized.

    Args:
        root: the whole (unwrapped) model, to record tied parameters before anything changes.
        device: where to allocate storage.
    """

    def __init__(self, root: nn.Module, device: torch.device) -> None:
        self.device = device
        self._groups = tied_parameter_groups(root)
        self._groups_of: dict[int, list[list[Slot]]] = {}
        for group in self._groups:
            for module, _ in group:
                self._groups_of.setdefault(id(module), []).append(group)
        self._done: set[int] = set()
        self._missing_reset: list[str] = []
        self._names = {id(m): name or type(root).__name__ for name, m in root.named_modules()}

    def __call__(self, module: nn.Module) -> None:
        """Materialize ``module``'s direct state (recursion is the caller's job)."""
        if id(module) in self._done:
            return
        self._done.add(id(module))
        if not owns_state(module):
            return
        with torch.no_grad():
            module.to_empty(device=self.device, recurse=False)
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
            else:
                self._missing_reset.append(self._names.get(id(module), type(module).__name__))
        self._retie(module)

    def _retie(self, current: nn.Module) -> None:
        """Re-tie the groups ``current`` takes part in, as far as their modules are done.

        Only groups touching ``current`` are visited: modules materialized earlier may
        already have been flattened by FSDP and must not be touched again.
        """
        for (module, name), *aliases in self._groups_of.get(id(current), []):
            if id(module) not in self._done:
                continue
            param = module._parameters[name]
            for alias_module, alias_name in aliases:
                if id(alias_module) in self._done and (
                    alias_module is current or module is current
                ):
                    alias_module._parameters[alias_name] = param

    def materialize(self, root: nn.Module) -> None:
        """Materialize every module of ``root`` (for strategies without FSDP1's callback)."""
        for module in root.modules():
            self(module)
        self.warn_missing_reset()

    def warn_missing_reset(self) -> None:
        """Warn about modules with state but no ``reset_parameters`` (left uninitialized)."""
        if self._missing_reset:
            names = ", ".join(sorted(set(self._missing_reset)))
            warnings.warn(
                f"Modules created under module_init_context(empty_init=True) own parameters or "
                f"buffers but define no reset_parameters(), so their values are uninitialized "
                f"memory: {names}. Add a reset_parameters() method or use empty_init=False.",
                UserWarning,
                stacklevel=3,
            )
            self._missing_reset.clear()
