"""Load built artifacts into the worker and find the op in them."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

Op = Callable[..., Any]


def load_op(artifact: Mapping[str, Any], op: Mapping[str, str]) -> Op:
    """The callable for `op` in one built artifact (original or candidate)."""
    path = str(artifact["artifact"])
    module = _load_module(path, str(artifact["module_name"]), str(artifact.get("init") or ""))
    if op["kind"] == "torch_op":
        namespaces: Mapping[str, str] = artifact.get("namespaces", {})
        renamed = namespaces.get(op["module"], op["module"])
        packet = getattr(getattr(torch.ops, renamed), op["name"])
        return packet  # type: ignore[no-any-return]
    if op["kind"] == "callable":
        target = importlib.import_module(op["module"])
        return getattr(target, op["name"])  # type: ignore[no-any-return]
    return getattr(module, op["name"])  # type: ignore[no-any-return]


def _load_module(path: str, name: str, init: str = "") -> Any:
    """Import a built extension by path under its own (tagged) name; `init`, when
    given, is the `PyInit_<init>` it exports (a library the repository's own build made
    keeps its real module name: the original and a candidate export the same).

    An artifact without a pybind11 module (a TORCH_LIBRARY-only build) is loaded as a
    plain shared library so its registrations run.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(init or name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    try:
        module = importlib.util.module_from_spec(spec)  # dlopen and PyInit happen here
        spec.loader.exec_module(module)
    except ImportError as exc:
        if "PyInit_" not in str(exc):
            raise
        torch.ops.load_library(path)
        return None
    sys.modules[name] = module
    return module


def load_reference(spec: Mapping[str, Any]) -> Op:
    """A reference callable from a synthesized lambda or a declared `module:function`."""
    ref = spec.get("callable_ref")
    if ref:
        module_name, _, func = str(ref).partition(":")
        return getattr(importlib.import_module(module_name), func)  # type: ignore[no-any-return]
    namespace: dict[str, Any] = {}
    for statement in spec.get("imports", []):
        exec(statement, namespace)  # import lines taken from the repository's own test
    for statement in spec.get("definitions", []):
        exec(statement, namespace)  # functions and constants carried out of the test
    fn = eval(str(spec["source"]), namespace)  # a lambda built by kfbot from the test
    return fn  # type: ignore[no-any-return]
