"""Naming a rank function in the controller and finding it again on the ranks.

Functions travel by reference (module + qualified name), never by pickled code. A test file
that pytest collected is found by its path too, because test directories may lack
``__init__.py`` and so may not be importable by name on the ranks; such files are imported
with pytest's assertion rewriting so that a failed ``assert`` on a rank shows the values.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from harness.wire.protocol import FnRef

__all__ = ["fn_ref_of", "install_rewriting", "resolve_fn", "rewritten_modules"]

_REF_CACHE: dict[Any, FnRef] = {}


def _lookup(module: ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def fn_ref_of(fn: Callable[..., Any]) -> FnRef:
    """Check that ``fn`` can be found on the ranks and return its reference.

    Raises:
        TypeError: ``fn`` is not callable.
        ValueError: ``fn`` is a lambda, a nested function, or not reachable by its name.
    """
    try:
        return _REF_CACHE[fn]
    except (KeyError, TypeError):
        pass
    if not callable(fn):
        raise TypeError(
            f"run_on_ranks(fn={fn!r}): fn must be a module-level function, got {type(fn).__name__}."
        )
    module_name = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module_name or not qualname or "<" in qualname:
        raise ValueError(
            f"run_on_ranks(fn={fn!r}): fn is not importable on the ranks (it is a lambda, "
            "a nested function or has no module); define it at module level in a test "
            "file or an importable module."
        )
    module = sys.modules.get(module_name)
    try:
        found = _lookup(module, qualname) if module is not None else None
    except AttributeError:
        found = None
    if found is not fn:
        raise ValueError(
            f"run_on_ranks(fn={fn!r}): {module_name}:{qualname} does not name this function "
            "(it was replaced, decorated without functools.wraps, or its module is not "
            "imported); pass a module-level function."
        )
    path = getattr(module, "__file__", None)
    rewrite = type(getattr(module, "__loader__", None)).__name__ == "AssertionRewritingHook"
    ref = FnRef(module_name, qualname, path if rewrite else None, rewrite)
    try:
        _REF_CACHE[fn] = ref
    except TypeError:
        pass
    return ref


def resolve_fn(ref: FnRef) -> Callable[..., Any]:
    """Find the function on a rank: by module name, or by path for a collected test file.

    Raises:
        ImportError: the module cannot be imported on the rank.
        AttributeError: the module has no such function.
    """
    module = sys.modules.get(ref.module)
    if module is None or (ref.path and getattr(module, "__file__", None) != ref.path):
        if ref.path is not None:
            module = _import_from_path(ref.module, ref.path, rewrite=ref.rewrite)
        else:
            module = importlib.import_module(ref.module)
    try:
        return _lookup(module, ref.qualname)
    except AttributeError as exc:
        raise AttributeError(
            f"module {ref.module!r} ({getattr(module, '__file__', '?')}) has no attribute "
            f"{ref.qualname!r} on this rank"
        ) from exc


def _import_from_path(name: str, path: str, *, rewrite: bool) -> ModuleType:
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        try:
            importlib.import_module(parent)
        except ImportError:
            pass
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name!r} from {path!r} on this rank")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if rewrite:
            exec(_rewritten_code(path), module.__dict__)
        else:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _rewritten_code(path: str) -> Any:
    from _pytest.assertion import rewrite, util

    with open(path, "rb") as f:
        source = f.read()
    tree = ast.parse(source, filename=path)
    rewrite.rewrite_asserts(tree, source, path, None)
    if util._reprcompare is None:
        util._reprcompare = _reprcompare
    return compile(tree, path, "exec", dont_inherit=True)


def rewritten_modules() -> dict[str, str]:
    """Modules pytest imported with assertion rewriting in this (controller) process:
    test files, conftests and ``pytest.register_assert_rewrite`` modules, name -> path."""
    found = {}
    for name, module in list(sys.modules.items()):
        loader = getattr(module, "__loader__", None)
        path = getattr(module, "__file__", None)
        if path and type(loader).__name__ == "AssertionRewritingHook":
            found[name] = path
    return found


class _RewritingLoader(importlib.abc.Loader):
    def __init__(self, path: str) -> None:
        self.path = path

    def exec_module(self, module: ModuleType) -> None:
        exec(_rewritten_code(self.path), module.__dict__)


class _RewritingFinder(importlib.abc.MetaPathFinder):
    """On a rank: import the controller's rewritten modules with rewriting too."""

    def __init__(self, modules: dict[str, str]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        file = self.modules.get(name)
        if file is None:
            return None
        package = [os.path.dirname(file)] if os.path.basename(file) == "__init__.py" else None
        return importlib.util.spec_from_file_location(
            name, file, loader=_RewritingLoader(file), submodule_search_locations=package
        )


def install_rewriting(modules: dict[str, str]) -> None:
    """Make this rank import ``modules`` (name -> path) with pytest's assertion rewriting."""
    if modules:
        sys.meta_path.insert(0, _RewritingFinder(modules))


def _plain(source: str, lexer: str = "python") -> str:
    """No colour: rank output is read as plain text."""
    return source


class _AssertConfig:
    """The two things pytest's comparison explainer asks of its config (pytest < 9.2)."""

    def get_verbosity(self, *_: Any) -> int:
        return 0

    def get_terminal_writer(self) -> Any:
        return self

    def _highlight(self, source: str, lexer: str = "python") -> str:
        return _plain(source, lexer)


def _explain(op: str, left: object, right: object) -> list[str]:
    """pytest's explanation lines; its signature changed in pytest 9.2 (keywords, no config)."""
    from _pytest.assertion import util

    explain: Any = util.assertrepr_compare
    if "highlighter" in inspect.signature(explain).parameters:
        lines = explain(
            op, left, right, verbose=0, highlighter=_plain, assertion_text_diff_style="ndiff"
        )
    else:
        lines = explain(_AssertConfig(), op, left, right)
    return list(lines or ())


def _reprcompare(op: str, left: object, right: object) -> str | None:
    """Detailed explanation of a failed comparison, as pytest prints it in the controller."""
    try:
        lines = _explain(op, left, right)
    except Exception:
        return None
    if not lines:
        return None
    return "\n~".join(line.replace("\n", "\\n") for line in lines).replace("%", "%%")
