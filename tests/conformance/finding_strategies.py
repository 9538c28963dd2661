"""Strategy factories for the findings tests: the reference with one or two planted bugs.

Each wraps the reference implementation, so everything but the planted defect conforms:

- :func:`raising_teardown`: ``teardown()`` raises after freeing (an API-8 violation, met at
  the end of nearly every check);
- :func:`clip_not_scaling`: ``clip_gradients_norm`` returns the right norm but does not scale
  the gradients (CLIP-1);
- :func:`two_bugs`: both of the above;
- :func:`setup_module_raises`: ``setup_module`` raises (API-2), so no check reaches its
  property;
- :func:`optimizer_step_raises`: ``optimizer_step`` raises (API-4) whenever it is called;
- :func:`load_empties_optimizers`: ``load_checkpoint`` restores the model and metadata but
  leaves every optimizer without state (CKPT-RT-1/RT-2: what a user's first load bug does);
- :func:`unsupported_everything`: refuses every family;
- :func:`raises_everything`: the factory raises for every configuration.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from harness.contract import StrategySpec, Unsupported
from reference_impl import make_strategy as reference_make_strategy

__all__ = [
    "clip_not_scaling",
    "load_empties_optimizers",
    "optimizer_step_raises",
    "raises_everything",
    "raising_teardown",
    "setup_module_raises",
    "two_bugs",
    "unsupported_everything",
]


def _teardown(cls: type) -> Any:
    def teardown(self: Any) -> None:
        cls.teardown(self)
        raise RuntimeError("teardown: checkpoint_io is not implemented for this strategy")

    return teardown


def _clip(cls: type) -> Any:
    def clip_gradients_norm(self: Any, module: Any, optimizer: Any, max_norm: float, **kw: Any):  # type: ignore[no-untyped-def]
        # the right norm, without the scaling: clip with an infinite bound
        return cls.clip_gradients_norm(self, module, optimizer, max_norm=float("inf"), **kw)

    return clip_gradients_norm


def _setup_module(cls: type) -> Any:
    def setup_module(self: Any, module: Any) -> Any:
        raise RuntimeError(f"setup_module cannot wrap {type(module).__name__} (planted bug)")

    return setup_module


def _optimizer_step(cls: type) -> Any:
    def optimizer_step(self: Any, optimizer: Any, **kwargs: Any) -> Any:
        raise RuntimeError("optimizer_step: the precision plugin has no scaler (planted bug)")

    return optimizer_step


def _load(cls: type) -> Any:
    def load_checkpoint(self: Any, path: Any, state: Any = None, strict: bool = True) -> Any:
        result = cls.load_checkpoint(self, path, state, strict)
        values = state.values() if isinstance(state, dict) else ()
        for value in values:
            for optimizer in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(optimizer, torch.optim.Optimizer):
                    optimizer.state.clear()  # the planted bug: the loaded state is dropped
        return result

    return load_checkpoint


_BUGS = {
    "teardown": _teardown,
    "clip_gradients_norm": _clip,
    "setup_module": _setup_module,
    "optimizer_step": _optimizer_step,
    "load_checkpoint": _load,
}


@functools.cache
def _broken(cls: type, bugs: tuple[str, ...]) -> type:
    methods = {name: _BUGS[name](cls) for name in bugs}
    return type(f"Broken{cls.__name__}", (cls,), methods)


def _with(spec: StrategySpec, *bugs: str) -> Any:
    strategy = reference_make_strategy(spec)
    strategy.__class__ = _broken(type(strategy), bugs)
    return strategy


def raising_teardown(spec: StrategySpec) -> Any:
    """The reference, except that ``teardown()`` raises after freeing."""
    return _with(spec, "teardown")


def clip_not_scaling(spec: StrategySpec) -> Any:
    """The reference, except that clipping returns the norm without scaling gradients."""
    return _with(spec, "clip_gradients_norm")


def two_bugs(spec: StrategySpec) -> Any:
    """A raising ``teardown`` and a clip that does not scale."""
    return _with(spec, "teardown", "clip_gradients_norm")


def setup_module_raises(spec: StrategySpec) -> Any:
    """The reference, except that ``setup_module`` raises."""
    return _with(spec, "setup_module")


def optimizer_step_raises(spec: StrategySpec) -> Any:
    """The reference, except that ``optimizer_step`` raises."""
    return _with(spec, "optimizer_step")


def load_empties_optimizers(spec: StrategySpec) -> Any:
    """The reference, except that ``load_checkpoint`` leaves the optimizers without state."""
    return _with(spec, "load_checkpoint")


def unsupported_everything(spec: StrategySpec) -> Any:
    """Refuses every configuration, naming the family."""
    raise Unsupported("this strategy is not implemented yet", "family", spec.family)


def raises_everything(spec: StrategySpec) -> Any:
    """Raises for every configuration (what a new user's half-written factory does)."""
    raise RuntimeError("MyStrategy.__init__() got an unexpected keyword argument 'precision'")
