"""The scan's vocabulary: small frozen records passed between the scan stages.

Per-file extraction produces `CudaFileFacts` and `PyFileFacts`; linking turns them
into `Kernel` records; `ScanReport` is what the commands render. Every record says
where it came from (`file`, 1-based `line`, and for config-declared facts
`origin="declared"`), so a report can always point a person at the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

# "observed": seen on a GPU, a test the kernel's mutant fails (`kfbot.scan.observed`).
Origin = Literal["discovered", "declared", "observed"]
R = TypeVar("R")


def evolve(record: R, **changes: Any) -> R:
    """`dataclasses.replace` for the scan's records, without re-running `__init__`:
    linking a large repository makes tens of thousands of changed copies."""
    new: R = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new
TunableKind = Literal[
    "define", "ifndef_default", "constexpr", "const", "template_arg", "launch_config",
    "build_flag",
]


@dataclass(frozen=True)
class Param:
    """A function or kernel parameter as written (`type` keeps qualifiers)."""

    type: str
    name: str


@dataclass(frozen=True)
class TemplateParam:
    kind: Literal["type", "value"]
    name: str
    type: str | None = None  # for value parameters, e.g. "int"
    default: str | None = None


@dataclass(frozen=True)
class LaunchSite:
    """One place a kernel is launched from host code."""

    file: str
    line: int
    kernel: str  # the callee as written, qualifiers included, e.g. "ns::mm"
    style: Literal["chevron", "cudaLaunchKernel", "function_pointer"]
    host_function: str | None  # qualified name of the enclosing host function
    template_args: tuple[str, ...] = ()
    grid: str | None = None
    block: str | None = None
    shared_mem: str | None = None
    stream: str | None = None
    args: tuple[str, ...] = ()
    scope: str = ""  # namespace the launch is written in, for name lookup
    uses: tuple[str, ...] = ()  # identifiers in the enclosing host function
    # What must hold in the host function for the launch to run, outermost first, as
    # written: "if (n >= 4096)", "else of if (algo == 0)", "case at::kFloat of switch
    # (x.scalar_type())", "#if KFOPS_USE_CLUSTERS".
    conditions: tuple[str, ...] = ()
    macro: str | None = None  # "NAME (file:line)" when the launch is written in a macro


@dataclass(frozen=True)
class Binding:
    """How Python reaches a host function: a pybind11 def or a torch library op."""

    kind: Literal["pybind11", "torch_library", "torch_library_impl"]
    name: str  # the Python-visible name, e.g. "softmax"
    cpp_function: str | None  # the bound host function, None for schema-only defs
    module: str  # PYBIND11_MODULE name or TORCH_LIBRARY namespace
    file: str
    line: int
    dispatch_key: str | None = None  # TORCH_LIBRARY_IMPL's key, e.g. "CUDA"
    # Functions the bound expression names besides `cpp_function`: the template
    # arguments of `&adapter<ns::launch>` (the adapter calls what it is given).
    reaches: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildRecipe:
    """How the repository builds an extension that holds kernels."""

    # kernel_builder: a Hugging Face kernel-builder `build.toml` (sources, flags and
    # capabilities per [kernel.*] section; the builder writes registration.h and _ops.py).
    # repository: the repository builds itself (`file` is its setup.py or pyproject.toml,
    # which may run CMake); which library holds the kernel is found after the build.
    kind: Literal["setup_py", "load", "load_inline", "kernel_builder", "repository"]
    name: str  # extension / module name
    file: str
    line: int
    sources: tuple[str, ...] = ()  # repo-relative source files
    inline: bool = False  # sources held in Python strings
    defines: tuple[tuple[str, str], ...] = ()  # -D flags, value "" for bare -DNAME
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()  # load_inline(functions=...)
    include_dirs: tuple[str, ...] = ()  # repo-relative extra include folders
    variable: str | None = None  # Python name the loaded module is bound to
    origin: Origin = "discovered"
    # What the scan could not decide statically, each "file:line: what, and what was
    # assumed" (a flag added under a run-time condition, a glob that matched nothing).
    cannot_tell: tuple[str, ...] = ()
    extension_class: str | None = None  # setup.py: "CUDAExtension" or "CppExtension"
    capabilities: tuple[str, ...] = ()  # kernel_builder: cuda-capabilities, e.g. ("9.0",)
    depends: tuple[str, ...] = ()  # kernel_builder: depends, e.g. ("torch", "cutlass_3_6")
    package_dir: str | None = None  # kernel_builder: the Python package, "torch-ext/<name>"


@dataclass(frozen=True)
class Tunable:
    """A number the search may change, and where it is set."""

    name: str
    value: str
    kind: TunableKind
    file: str
    line: int
    values_seen: tuple[str, ...] = ()  # e.g. template arguments used at launch sites
    origin: Origin = "discovered"


@dataclass(frozen=True)
class InlineSource:
    """CUDA or C++ source held in a Python string (or read from a file) for load_inline."""

    build: str  # the load_inline name
    language: Literal["cuda", "cpp"]
    text: str | None  # the code, when it is a literal in the Python file
    line_offset: int  # 0-based line in `file` where `text` starts
    path: str | None = None  # repo-relative file read into load_inline, when not a literal


@dataclass(frozen=True)
class Step:
    """One link of the chain from a test to a kernel (`kfbot scan --explain`)."""

    kind: Literal["test", "python", "op", "binding", "host", "launch", "kernel"]
    name: str  # what sits at this place, e.g. "fusedact.functional.fused_gelu"
    file: str
    line: int


@dataclass(frozen=True)
class ReferenceTest:
    """A test or script that compares a bound op with a pure-PyTorch computation."""

    file: str
    line: int
    test: str  # test function name, or "<module>" for script code
    kind: Literal["pytest", "script", "declared"]
    op: str  # the op call as written, e.g. "ext.softmax"
    op_name: str  # the bound name called, e.g. "softmax"
    module_hint: str | None  # build/extension/namespace the call resolves to, if known
    reference: str | None  # the reference expression or function, as written
    comparison: str  # e.g. "torch.testing.assert_close"
    shapes: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    why: str = ""
    confidence: float = 0.0
    origin: Origin = "discovered"
    # The name the test calls, through its imports, when it is not the op itself:
    # "fusedact.fused_gelu", ".ops.swiglu" (relative to the test's folder).
    target: str | None = None
    # How a mismatch shows: an exception (pytest, assert, assert_close), the script's
    # exit status (sys.exit(1) on a mismatch) or only in what the script prints.
    mismatch_signal: Literal["exception", "exit_status", "printed"] = "exception"
    backward: bool = False  # the comparison checks gradients (the op's backward pass)
    helper: str | None = None  # "check (tests/conftest.py:12)": compares through a helper
    # The comparison's own tolerances, where the test writes them as numbers
    # (`assert_close(out, ref, rtol=1e-4, atol=1e-3)`).
    atol: float | None = None
    rtol: float | None = None
    # From the test to the kernel, once linked: test, Python wrappers, op, binding,
    # host functions, launch, kernel.
    chain: tuple[Step, ...] = ()


# How a Problem says that tree-sitter could not read parts of a file, followed by how
# many places: code it cannot read may compile all the same (a macro it does not know).
NOT_UNDERSTOOD = "tree-sitter did not understand"


@dataclass(frozen=True)
class Problem:
    """Something the scan could not read or understand; the scan goes on."""

    file: str
    line: int | None
    message: str
    severity: Literal["error", "warning", "info"] = "warning"


@dataclass(frozen=True)
class KernelDef:
    """A `__global__` function as found in one file, before linking."""

    name: str
    namespace: str  # "" for the global namespace, else "a::b"
    file: str
    line: int
    # Linking keys dicts by kernel; the fields below take long to hash and add nothing to
    # tell kernels apart, so they are compared (for equality) but not hashed.
    template_params: tuple[TemplateParam, ...] = field(default=(), hash=False)
    params: tuple[Param, ...] = field(default=(), hash=False)
    launch_bounds: tuple[str, ...] | None = None
    line_offset: int = 0  # non-zero when parsed out of a Python string
    # identifiers in the signature and body (for tunables)
    uses: tuple[str, ...] = field(default=(), hash=False)
    # Attributes besides __launch_bounds__, as written: "__cluster_dims__(2, 1, 1)".
    attributes: tuple[str, ...] = field(default=(), hash=False)
    extern_c: bool = False  # declared extern "C": its symbol is its plain name
    # The preprocessor conditions the definition sits under: "#if KFOPS_USE_CLUSTERS".
    preprocessor: tuple[str, ...] = field(default=(), hash=False)

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class HostCall:
    """A call from one host function to another (to follow launchers to bindings).

    `reference` calls name the callee without calling it here: a function passed as an
    argument or a template argument, or stored in a function-pointer variable.
    """

    caller: str
    callee: str
    scope: str = ""  # namespace the call is written in, for name lookup
    arity: int = -1  # arguments passed; -1 for a reference
    line: int = 0
    reference: bool = False
    conditions: tuple[str, ...] = ()  # as LaunchSite.conditions
    # A bare name handed over as a value (`run(launch)`): it may as well be a variable,
    # so it only counts where the scope it is written in sees a function of that name.
    bare: bool = False


@dataclass(frozen=True)
class HostFunction:
    """A host function definition, by qualified name (for scoped call resolution)."""

    name: str  # "kfops::scale::forward"
    file: str
    line: int
    params: tuple[str, ...] = ()  # parameter names
    required: int = 0  # parameters without a default


@dataclass(frozen=True)
class MacroDef:
    """A function-like macro definition: `#define NAME(params) body`."""

    name: str
    params: tuple[str, ...]  # "..." for a variadic tail
    body: str
    file: str
    line: int


@dataclass(frozen=True)
class MacroUse:
    """A function-like macro invoked where a launch could hide in it."""

    name: str
    args: tuple[str, ...]
    file: str
    line: int
    host_function: str | None  # None at file scope
    scope: str = ""
    conditions: tuple[str, ...] = ()  # as LaunchSite.conditions, at the invocation


@dataclass(frozen=True)
class CudaFileFacts:
    """Everything one CUDA/C++ file (or inline source) says, before linking."""

    file: str
    kernels: tuple[KernelDef, ...] = ()
    launches: tuple[LaunchSite, ...] = ()
    bindings: tuple[Binding, ...] = ()
    tunables: tuple[Tunable, ...] = ()
    includes: tuple[str, ...] = ()  # quoted includes, as written
    host_calls: tuple[HostCall, ...] = ()
    using_namespaces: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()
    functions: tuple[HostFunction, ...] = ()
    macros: tuple[MacroDef, ...] = ()
    macro_uses: tuple[MacroUse, ...] = ()
    # Object-like macros whose value is a name: ("KFOPS_NAMESPACE", "kfops").
    aliases: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PySymbol:
    """A name a Python file defines or imports at its top level, and where using it
    leads, for following calls from module to module.

    Paths are written as imports are: absolute ("fusedact._C.gelu_fwd") or relative to
    the file's folder (".functional.fused_gelu"; a name of the file itself is
    ".<module>.<name>", or ".<name>" in an `__init__.py`).
    """

    name: str  # "fused_gelu", "GeluFunction", "GeluFunction.forward", "ops"
    line: int
    kind: Literal["function", "class", "variable", "import", "extension"]
    # function: what it calls, hands over or returns; class: its bases; variable and
    # import: what it is bound to. Each with its line.
    targets: tuple[tuple[str, int], ...] = ()
    extension: str | None = None  # kind "extension": the build or torch.ops namespace
    compares: tuple[int, int] | None = None  # a helper comparing two of its parameters


@dataclass(frozen=True)
class PyFileFacts:
    """Everything one Python file says about builds, inline sources and reference tests."""

    file: str
    builds: tuple[BuildRecipe, ...] = ()
    inline_sources: tuple[InlineSource, ...] = ()
    references: tuple[ReferenceTest, ...] = ()
    problems: tuple[Problem, ...] = ()
    symbols: tuple[PySymbol, ...] = ()


@dataclass(frozen=True)
class Dispatch:
    """An op that runs one of several kernels, chosen at run time, seen from one of them."""

    op: str  # "module.name" of the binding, e.g. "kfops.softplus"
    kernels: tuple[str, ...]  # ids of every kernel the op can run, this one included
    # What must hold for this kernel to run, outermost first; () for the op's default
    # kernel, which runs when no sibling's conditions hold.
    conditions: tuple[str, ...]
    # Parameters of the bound function (the op's arguments, or those of a launcher handed
    # to it) that the conditions read, e.g. ("algo",).
    arguments: tuple[str, ...]
    # What chooses: "argument", "dtype", "size", "preprocessor" or "other", one per
    # condition.
    by: tuple[str, ...]
    file: str  # where the innermost condition is written
    line: int


Verdict = Literal["checks", "launches-only", "unconfirmed", "fails-on-original"]
VERDICT_WORDS: dict[Verdict, str] = {
    "checks": "checks it: the mutant that writes nothing fails it",
    "launches-only": "launches but does not check it: the mutant that writes nothing passes",
    "unconfirmed": "launches it; not confirmed by a mutant",
    "fails-on-original": "launches it, but fails on the original",
}


@dataclass(frozen=True)
class ObservedTest:
    """One test (pytest node or script) seen launching a kernel on a GPU, and whether a
    mutant of the kernel that writes nothing fails it."""

    test: str  # the node id, or the script's path
    kind: Literal["pytest", "script"]
    ops: tuple[str, ...]  # the ops the launches came through ("obs_ext.scale")
    verdict: Verdict
    why: str = ""  # the mutant's outcome, or why there was none

    def line(self) -> str:
        through = f" through {', '.join(self.ops)}" if self.ops else ""
        why = f" ({self.why})" if self.why else ""
        return f"{self.test}{through}: {VERDICT_WORDS[self.verdict]}{why}"


@dataclass(frozen=True)
class Observations:
    """One observation of a repository at one state (`key`: its commit and dirty state)."""

    key: str
    kernels: tuple[tuple[str, tuple[ObservedTest, ...]], ...] = ()  # by kernel id
    # Per test file or script: what stopped it, or why it was not run (twins).
    files: tuple[str, ...] = ()
    # Kernels launched that no scanned definition matches (library kernels), a few.
    foreign: tuple[str, ...] = ()
    note: str = ""  # what limits the whole observation ("no CUDA device ...")
    tests_run: int = 0

    def of(self, kernel_id: str) -> tuple[ObservedTest, ...]:
        return next((tests for k, tests in self.kernels if k == kernel_id), ())


@dataclass(frozen=True)
class Kernel:
    """A kernel after linking: what it is, how it is launched, built, reached and tested."""

    definition: KernelDef
    launch_sites: tuple[LaunchSite, ...] = ()
    bindings: tuple[Binding, ...] = ()
    builds: tuple[BuildRecipe, ...] = ()
    tunables: tuple[Tunable, ...] = ()
    references: tuple[ReferenceTest, ...] = ()
    editable_files: tuple[str, ...] = ()
    origin: Origin = "discovered"
    task: str | None = None  # name of the config task that declared or amended it
    dispatch: tuple[Dispatch, ...] = ()
    # Without references: the first link from a test to this kernel that the scan could
    # not follow, each "file:line: what and why" (also shown by `scan --explain`).
    unpaired: tuple[str, ...] = ()
    observed: tuple[ObservedTest, ...] = ()  # tests seen launching it on a GPU

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def file(self) -> str:
        return self.definition.file

    @property
    def id(self) -> str:
        """`file::qualified_name`, unique within a scan and accepted on the command line."""
        return f"{self.definition.file}::{self.definition.qualified_name}"


@dataclass(frozen=True)
class ScanReport:
    root: str
    kernels: tuple[Kernel, ...]
    problems: tuple[Problem, ...] = ()
    files_scanned: int = 0
    skipped_dirs: tuple[str, ...] = field(default=())
    # Calls from tests into the repository's Python code that led to no op, each
    # "test file:line: test calls NAME; the first link not followed: file:line: why".
    unfollowed: tuple[str, ...] = ()
    # Every build the scan read, whether or not it compiles a kernel (what a kernel
    # without a build is told about).
    builds: tuple[BuildRecipe, ...] = ()
    observed: Observations | None = None  # the tests run on a GPU, when kfbot has

