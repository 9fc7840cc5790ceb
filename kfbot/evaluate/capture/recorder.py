"""Record how named ops are called by a repository's own tests and scripts.

The recorder of the capture plugin (`kfbot.evaluate.capture.plugin`, for pytest) and
of the script runner (`kfbot.evaluate.capture.harness`), both switched on by the
`KFBOT_CAPTURE` environment variable, a JSON `CaptureRequest`:

    {"ops": [{"kind": "module", "module": "inline_softmax", "name": "softmax"}],
     "out": "/tmp/capture.json", "max_calls": 500}

Each op is replaced by a wrapper that describes the arguments, calls the original
with them unchanged, and returns its result or lets its exception through. Where the
wrapper goes depends on how the repository reaches the op:

- `module`: an attribute of a module. Modules returned by
  `torch.utils.cpp_extension.load`/`load_inline` with a matching `name=` are wrapped
  as they are returned (and when kfbot staged a build of that name, `load` returns
  kfbot's build instead of compiling the repository's sources again); modules
  imported by name are wrapped when their import finishes (a `sys.meta_path` hook)
  or, when already imported, before each test.
- `torch_op`: the `torch.ops.<ns>.<op>` attribute is replaced by a proxy on the
  namespace object (setattr works there in torch 2.x) once the op is registered
  (looked for again after each library load); attribute access (`.default`, overload
  names) goes to the real packet, unrecorded.
- `callable`: the attribute of its module (imported after collection when the tests
  did not), plus every module global that still holds the original, which catches
  `from pkg.mod import func` done before the wrapper was in place.

Calls are described before the op runs (an op may write into its inputs) and kept
only when it returns: a call that raises is counted but makes no signature. Per op,
the first `max_calls` calls are described; later ones are only counted.

torch is imported only once the repository's code has imported it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from kfbot.anticheat.adequacy import unmutated
from kfbot.evaluate.capture.describe import compiling, describe
from kfbot.evaluate.capture.imports import PostImportFinder, current_finder
from kfbot.evaluate.capture.protocol import CAPTURE_ENV, CaptureFile, CaptureRequest
from kfbot.evaluate.capture.signature import CallSignature, OpRef, merge_pair, signature_key
from kfbot.evaluate.capture.via import Via, answers_in_arguments, returned, trace

if TYPE_CHECKING:
    pass

_CPP_EXTENSION = "torch.utils.cpp_extension"
_LOADERS = ("load", "load_inline")
_TORCH_OPS = "torch._ops"  # its `ops.load_library` registers a library's ops

AnyCallable = Callable[..., object]


@dataclass(frozen=True)
class _Patch:
    """One attribute we replaced, and what was there before."""

    owner: object
    attr: str
    previous: object


class Capture:
    """The recording state of one session, and the wrappers that feed it.

    `install()` puts the wrappers in place, `refresh()` catches ops and references
    that appeared since, `uninstall()` puts every original back.
    """

    def __init__(self, request: CaptureRequest, save_to: Path | None = None) -> None:
        self.request = request
        # Written at each new signature: a script has no test boundaries to save at,
        # and one that fails or exits later must not lose what it showed.
        self._save_to = save_to
        self.test_id = ""  # the node id of the test running now; "" outside tests
        self._refs = {ref.text: ref for ref in request.ops}
        self._lock = threading.RLock()
        self._signatures: dict[tuple[object, ...], CallSignature] = {}
        self._calls = dict.fromkeys(self._refs, 0)
        self._raised = dict.fromkeys(self._refs, 0)
        self._unmutated = 0  # calls a mutant left as they were
        self._recorded = dict.fromkeys(self._refs, 0)
        self._errors: dict[str, None] = {}  # an ordered set
        self._patches: list[_Patch] = []
        # id(original) -> (original, wrapper); the originals are kept alive, so ids hold.
        self._wrappers: dict[int, tuple[object, object]] = {}
        self._ours: set[int] = set()
        self._scanned: dict[str, tuple[int, int]] = {}
        self._finder: PostImportFinder | None = None
        self._found: set[str] = set()  # ops wrapped at least once
        self._outer = {ref.text: ref for ref in request.outer if ref.kind == "callable"}
        self._frames = threading.local()  # the wrapper calls under way, in this thread
        self.dirty = False
        # Entered around each call of an op (the observer's profiler range and poison).
        self.around: Callable[[str, Sequence[object]], AbstractContextManager[None]] | None = None

    # --- installing -------------------------------------------------------------------

    def install(self) -> None:
        watched = {ref.module for ref in self._refs.values() if ref.kind != "torch_op"}
        watched |= {ref.module for ref in self._outer.values()}
        watched |= {_CPP_EXTENSION, _TORCH_OPS}
        for name in (_CPP_EXTENSION, _TORCH_OPS):
            module = sys.modules.get(name)
            if module is not None:
                self._patch_loaders(module)
        staged = current_finder()
        if staged is not None:
            staged.on_load = self.after_load
        self._finder = PostImportFinder(frozenset(watched), self._on_import)
        sys.meta_path.insert(0, self._finder)
        self.refresh()

    def uninstall(self) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        for patch in reversed(self._patches):
            # Leave alone what the repository replaced after us.
            if id(getattr(patch.owner, patch.attr, None)) in self._ours:
                _try_setattr(patch.owner, patch.attr, patch.previous)
        self._patches.clear()

    def import_callables(self) -> None:
        """Import the modules of callable ops that the tests have not imported."""
        for ref in self._refs.values():
            if ref.kind == "callable" and ref.module not in sys.modules:
                try:
                    importlib.import_module(ref.module)
                except Exception as exc:
                    self.error(f"{ref.text}: cannot import {ref.module}: {_one_line(exc)}")

    def refresh(self) -> None:
        """Wrap ops that have appeared and references to originals that remain."""
        for ref in self._refs.values():
            if ref.kind == "torch_op":
                self._wrap_torch_op(ref)
            else:
                module = sys.modules.get(ref.module)
                if module is not None:
                    self._wrap_attr(module, ref)
        for ref in self._outer.values():
            module = sys.modules.get(ref.module)
            if module is not None:
                self._wrap_outer(module, ref)
        self._patch_references()

    def _module_refs(self) -> list[OpRef]:
        return [ref for ref in self._refs.values() if ref.kind == "module"]

    def after_load(self, module: object) -> None:
        """A library was loaded: the ops it registers can be wrapped now."""
        del module
        for ref in self._refs.values():
            if ref.kind == "torch_op":
                self._wrap_torch_op(ref)

    def _on_import(self, module: ModuleType) -> None:
        # The name it was imported by: an extension's own `__name__` is the one its
        # PyInit gave it (a build's TORCH_EXTENSION_NAME), not the import's.
        spec = getattr(module, "__spec__", None)
        name = spec.name if spec is not None else module.__name__
        if name in (_CPP_EXTENSION, _TORCH_OPS):
            self._patch_loaders(module)
        for ref in self._refs.values():
            if ref.kind != "torch_op" and ref.module == name:
                self._wrap_attr(module, ref)
        for ref in self._outer.values():
            if ref.module == name:
                self._wrap_outer(module, ref)

    def _wrap_attr(self, owner: object, ref: OpRef) -> None:
        current = getattr(owner, ref.name, None)
        if current is None or id(current) in self._ours:
            return
        if isinstance(current, type) or not callable(current):
            self.error(f"{ref.text}: {type(current).__name__} is not a function; not recorded")
            return
        self._found.add(ref.text)
        wrapper = self._wrapper(current, lambda: self._function_wrapper(ref, current))
        self._set(owner, ref.name, current, wrapper)

    def _wrap_outer(self, owner: object, ref: OpRef) -> None:
        """A wrapper the tests call: its calls are not recorded, but the op's calls
        made inside one say how its arguments reached the op."""
        current = getattr(owner, ref.name, None)
        if current is None or id(current) in self._ours or not callable(current) \
                or isinstance(current, type):
            return  # a class stays a class; without the wrapper, fewer calls are judged
        wrapper = self._wrapper(current, lambda: self._outer_wrapper(ref, current))
        self._set(owner, ref.name, current, wrapper)

    def _wrap_torch_op(self, ref: OpRef) -> None:
        if "torch" not in sys.modules:
            return  # no test has imported torch, so none has called a torch op
        import torch

        namespace = getattr(torch.ops, ref.module)
        try:
            packet = getattr(namespace, ref.name)
        except (AttributeError, RuntimeError):
            return  # not registered yet; a later refresh tries again
        if id(packet) not in self._ours:
            self._found.add(ref.text)
            wrapper = self._wrapper(packet, lambda: _OpProxy(self, ref.text, packet))
            self._set(namespace, ref.name, packet, wrapper)

    def _patch_loaders(self, module: ModuleType) -> None:
        if module.__name__ == _TORCH_OPS:
            ops = getattr(module, "ops", None)
            original = getattr(ops, "load_library", None)
            if callable(original) and id(original) not in self._ours:
                wrapper = self._wrapper(original, functools.partial(self._library_wrapper,
                                                                    original))
                self._set(ops, "load_library", original, wrapper)
            return
        for name in _LOADERS:
            original = getattr(module, name, None)
            if callable(original) and id(original) not in self._ours:
                wrapper = self._wrapper(original, functools.partial(self._loader_wrapper, original))
                self._set(module, name, original, wrapper)

    def _wrapper(self, original: object, make: Callable[[], object]) -> object:
        """The one wrapper of `original`, made on first use."""
        known = self._wrappers.get(id(original))
        if known is not None:
            return known[1]
        wrapper = make()
        self._wrappers[id(original)] = (original, wrapper)
        self._ours.add(id(wrapper))
        self._scanned.clear()  # any module may hold this new original: scan all again
        return wrapper

    def _set(self, owner: object, attr: str, original: object, wrapper: object) -> None:
        try:
            setattr(owner, attr, wrapper)
        except (AttributeError, TypeError) as exc:
            self.error(f"cannot wrap {attr} on {_describe_owner(owner)}: {_one_line(exc)}")
            return
        self._patches.append(_Patch(owner, attr, original))

    def _patch_references(self) -> None:
        """Point module globals that still hold an original at its wrapper."""
        for name, module in list(sys.modules.items()):
            if not isinstance(module, ModuleType):
                continue
            namespace = vars(module)
            # A module whose globals have not changed in number since the last scan
            # is skipped: scanning all of torch's modules before every test adds up.
            stamp = (id(module), len(namespace))
            if self._scanned.get(name) == stamp:
                continue
            self._scanned[name] = stamp
            for attr, value in list(namespace.items()):
                known = self._wrappers.get(id(value))
                if known is not None and known[0] is value:
                    self._set(module, attr, value, known[1])

    # --- wrappers ---------------------------------------------------------------------

    def _function_wrapper(self, ref: OpRef, original: AnyCallable) -> AnyCallable:
        op = ref.text

        @functools.wraps(original)
        def wrapper(*args: object, **kwargs: object) -> object:
            return self.call(op, original, args, kwargs)

        return wrapper

    def _outer_wrapper(self, ref: OpRef, original: AnyCallable) -> AnyCallable:
        @functools.wraps(original)
        def wrapper(*args: object, **kwargs: object) -> object:
            stack: list[_Frame] = self._frames.__dict__.setdefault("stack", [])
            frame = _Frame(ref.text, args)
            stack.append(frame)
            result: object = None
            try:
                result = original(*args, **kwargs)
                return result
            finally:
                stack.pop()
                self._settle(frame, result)

        return wrapper

    def _settle(self, frame: _Frame, result: object) -> None:
        """The op's calls made inside a wrapper call, kept with how they got there."""
        for sig, op_args, in_args in frame.pending:
            mapped, consts = trace(frame.args, op_args, _same)
            back = returned(result, op_args) if in_args else ()
            self._keep(replace(sig, via=Via(frame.outer, mapped, consts, back)))

    def _loader_wrapper(self, original: AnyCallable) -> AnyCallable:
        @functools.wraps(original)
        def load(*args: object, **kwargs: object) -> object:
            name = kwargs.get("name", args[0] if args else None)
            staged = current_finder()
            module: object
            if staged is not None and isinstance(name, str) and name in staged.names:
                module = staged.load(name, python_module=kwargs.get("is_python_module", True)
                                     is not False)
            else:
                module = original(*args, **kwargs)
            if isinstance(module, ModuleType):
                for ref in self._module_refs():
                    if ref.module == name:
                        self._wrap_attr(module, ref)
            self.after_load(module)
            return module

        return load

    def _library_wrapper(self, original: AnyCallable) -> AnyCallable:
        @functools.wraps(original)
        def load_library(*args: object, **kwargs: object) -> object:
            result = original(*args, **kwargs)
            self.after_load(result)
            return result

        return load_library

    def call(
        self, op: str, original: AnyCallable, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> object:
        """Call `original` exactly as asked, recording the call if it returns."""
        described = self._describe_call(op, args, kwargs)
        around = self.around(op, args) if self.around is not None else contextlib.nullcontext()
        try:
            with around:
                result = original(*args, **kwargs)
        except BaseException:
            with self._lock:
                self._raised[op] += 1
            raise
        stack: list[_Frame] = self._frames.__dict__.get("stack", [])
        if described is not None and stack:
            # The test called the outermost wrapper: the reference is over its arguments.
            # An op answering in its arguments: what the wrapper returned of them is its
            # output.
            stack[0].pending.append((described, tuple(args), answers_in_arguments(result)))
        elif described is not None:
            self._keep(described)
        if self.request.mutant:
            return self._mutated(op, result, args, kwargs, original)
        return result

    def _mutated(self, op: str, result: object, args: Sequence[object],
                 kwargs: Mapping[str, object], original: AnyCallable) -> object:
        """The op's result replaced by a trivial mutant, to see whether the test notices
        (some mutants call the op again, on inputs of their own)."""
        from kfbot.anticheat.mutants import NotApplicable, mutate

        try:
            return mutate(str(self.request.mutant), result, args, kwargs, original)
        except NotApplicable as exc:
            # Numbered, so each call left as it was is a message of its own: the gate
            # counts them against the calls (a mutant that changed none did not run).
            with self._lock:
                self._unmutated += 1
                n = self._unmutated
            self.error(unmutated(op, str(exc), f"{n} in process {os.getpid()}"))
            return result

    def _describe_call(
        self, op: str, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> CallSignature | None:
        with self._lock:
            self._calls[op] += 1
            if self._recorded[op] >= self.request.max_calls or compiling():
                return None
            test = self.test_id
        try:
            return CallSignature(
                op=op,
                args=tuple(describe(a) for a in args),
                kwargs=tuple((k, describe(kwargs[k])) for k in sorted(kwargs)),
                tests=(test,) if test else (),
            )
        except Exception as exc:  # a recorder bug must never fail the repository's test
            self.error(f"{op}: cannot describe a call: {_one_line(exc)}")
            return None

    def _keep(self, sig: CallSignature) -> None:
        key = signature_key(sig)
        with self._lock:
            seen = self._signatures.get(key)
            self._signatures[key] = sig if seen is None else merge_pair(seen, sig)
            self._recorded[sig.op] += 1
            self.dirty = True
            if seen is None and self._save_to is not None:
                self.save(self._save_to)

    # --- results ----------------------------------------------------------------------

    def error(self, message: str) -> None:
        with self._lock:
            self._errors[message] = None
            self.dirty = True

    def result(self) -> CaptureFile:
        with self._lock:
            return CaptureFile(
                signatures=tuple(self._signatures.values()),
                op_calls=tuple(self._calls.items()),
                raised_calls=tuple(self._raised.items()),
                errors=tuple(self._errors),
                found=tuple(op for op in self._refs if op in self._found),
            )

    def save(self, path: Path) -> None:
        """`write`, with a failure told on stderr: the repository's code goes on."""
        try:
            self.write(path)
        except OSError as exc:
            print(f"kfbot capture: cannot write {path}: {_one_line(exc)}", file=sys.stderr)

    def write(self, path: Path) -> None:
        """Replace `path` with the results so far, atomically."""
        text = json.dumps(self.result().to_json(), indent=1)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
        self.dirty = False


@dataclass
class _Frame:
    """One wrapper call under way, and the op's calls made inside it so far."""

    outer: str
    args: tuple[object, ...]
    pending: list[tuple[CallSignature, tuple[object, ...], bool]] = field(default_factory=list)


def _same(outer: object, inner: object) -> bool:
    """Whether a wrapper's argument reached the op as this argument: the same object,
    a view of the same memory (`x.contiguous()` of a contiguous x), or an equal plain
    value of the same type."""
    if outer is inner:
        return True
    if "torch" in sys.modules:
        import torch

        if isinstance(outer, torch.Tensor) and isinstance(inner, torch.Tensor):
            return (outer.data_ptr() == inner.data_ptr() and outer.shape == inner.shape
                    and outer.dtype == inner.dtype and outer.stride() == inner.stride())
    plain = (int, float, str)
    return type(outer) is type(inner) and isinstance(outer, plain) and outer == inner


class _OpProxy:
    """Stands in for a `torch.ops` packet: calls are recorded, the rest is delegated;
    an overload (`.default`, `.out`) is a proxy too, recorded as the op."""

    def __init__(self, capture: Capture, op: str, packet: AnyCallable) -> None:
        self._capture = capture
        self._op = op
        self._packet = packet

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._capture.call(self._op, self._packet, args, kwargs)

    def __getattr__(self, name: str) -> object:
        value = getattr(self._packet, name)
        if type(value).__name__ == "OpOverload":
            return _OpProxy(self._capture, self._op, value)
        return value

    def __repr__(self) -> str:
        return repr(self._packet)

    def __str__(self) -> str:
        return str(self._packet)


def _try_setattr(owner: object, attr: str, value: object) -> None:
    with contextlib.suppress(AttributeError, TypeError):
        setattr(owner, attr, value)


def _describe_owner(owner: object) -> str:
    return getattr(owner, "__name__", None) or type(owner).__name__


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def request_from_environment() -> CaptureRequest | None:
    """The request in `KFBOT_CAPTURE`, or None when capture is off."""
    text = os.environ.get(CAPTURE_ENV)
    if not text:
        return None
    return CaptureRequest.from_json(json.loads(text))


def output_path(out: str) -> Path:
    """Where this process writes: pytest-xdist workers each get their own file."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return Path(f"{out}.{worker}") if worker else Path(out)


def one_line(exc: BaseException) -> str:
    return _one_line(exc)
