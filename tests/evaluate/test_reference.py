"""Reference tests become callable references (or a reason why not)."""

from __future__ import annotations

from pathlib import Path

from kfbot.evaluate.reference.spec import ReferenceSpec, Unusable, belongs, reference_spec
from kfbot.scan.model import ReferenceTest


def _ref(**kw: object) -> ReferenceTest:
    base: dict[str, object] = dict(file="tests/test_op.py", line=6, test="test_op", kind="pytest",
                                   op="ext.op", op_name="op", module_hint="ext",
                                   reference="torch.softmax(x, dim=-1)",
                                   comparison="torch.testing.assert_close")
    base.update(kw)
    return ReferenceTest(**base)  # type: ignore[arg-type]


def _write(root: Path, text: str) -> None:
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "test_op.py").write_text(text)


def test_lambda_over_the_op_arguments(tmp_path: Path) -> None:
    _write(tmp_path, "import torch\nimport torch.nn.functional as F\nfrom m import ext\n\n"
                     "def test_op():\n    x = torch.randn(4, 5)\n"
                     "    torch.testing.assert_close(ext.op(x), torch.softmax(x, dim=-1))\n")
    spec = reference_spec(tmp_path, _ref())
    assert spec == ReferenceSpec(source="lambda x: torch.softmax(x, dim=-1)",
                                 imports=("import torch",),
                                 description="torch.softmax(x, dim=-1) from tests/test_op.py:6",
                                 tests=("tests/test_op.py::test_op",),
                                 comparison="torch.testing.assert_close")
    fn = eval(spec.source, {"torch": __import__("torch")})
    assert fn.__code__.co_argcount == 1


def test_literal_arguments_become_placeholders(tmp_path: Path) -> None:
    _write(tmp_path, "import torch.nn.functional as F\n\ndef test_op():\n    x = w = b = 0\n"
                     "    out = ext.op(x, w, b, 1e-5)\n"
                     "    assert_close(out, F.layer_norm(x, (x.shape[-1],), w, b, 1e-5))\n")
    spec = reference_spec(tmp_path, _ref(reference="F.layer_norm(x, (x.shape[-1],), w, b, 1e-05)"))
    assert isinstance(spec, ReferenceSpec)
    assert spec.source == "lambda x, w, b, _a3: F.layer_norm(x, (x.shape[-1],), w, b, _a3)"
    assert spec.imports == ("import torch.nn.functional as F",)


def test_a_constant_of_the_test_is_carried_a_random_value_is_not(tmp_path: Path) -> None:
    _write(tmp_path, "import torch\n\ndef test_op():\n    x = torch.randn(3)\n    s = 2.0\n"
                     "    assert_close(ext.op(x), x * s)\n")
    spec = reference_spec(tmp_path, _ref(reference="x * s"))
    assert isinstance(spec, ReferenceSpec) and spec.definitions == ("s = 2.0",)
    _write(tmp_path, "import torch\n\ndef test_op():\n    x = torch.randn(3)\n"
                     "    s = torch.rand(1)\n    assert_close(ext.op(x), x * s)\n")
    spec = reference_spec(tmp_path, _ref(reference="x * s"))
    assert spec == Unusable("the reference x * s cannot be carried: s is a value the test "
                            "computes (s = torch.rand(1)), which the op call does not pass")


def test_keyword_calls_and_missing_calls(tmp_path: Path) -> None:
    _write(tmp_path, "def test_op():\n    assert_close(ext.op(x, dim=1), x)\n")
    assert isinstance(reference_spec(tmp_path, _ref(reference="x")), Unusable)
    _write(tmp_path, "def test_op():\n    assert_close(other(x), x)\n")
    assert reference_spec(tmp_path, _ref(reference="x")) == Unusable(
        "the call ext.op(...) was not found in test_op")


def test_declared_reference_is_a_callable(tmp_path: Path) -> None:
    spec = reference_spec(tmp_path, _ref(origin="declared", reference="ref:square_ref",
                                         file="kfbot.yaml"))
    assert isinstance(spec, ReferenceSpec) and spec.callable_ref == "ref:square_ref"


GELU_REF = """\
import math

import torch

SQRT_2 = math.sqrt(2.0)


def gelu_ref(t):
    return 0.5 * t * (1.0 + torch.erf(t / SQRT_2))
"""


def _run(spec: ReferenceSpec | Unusable, *args: object) -> object:
    assert isinstance(spec, ReferenceSpec), spec
    from kfbot.evaluate.device.loading import load_reference

    return load_reference(spec.to_json())(*args)


def test_a_function_of_the_test_module_is_carried_with_what_it_needs(tmp_path: Path) -> None:
    torch = __import__("torch")
    _write(tmp_path, GELU_REF + "from m import ext\n\ndef test_op():\n"
                     "    x = torch.randn(8)\n    assert_close(ext.op(x), gelu_ref(x))\n")
    spec = reference_spec(tmp_path, _ref(reference="gelu_ref(x)", line=14))
    assert isinstance(spec, ReferenceSpec)
    assert spec.imports == ("import math", "import torch")
    assert spec.definitions == ("SQRT_2 = math.sqrt(2.0)",
                                "def gelu_ref(t):\n    return 0.5 * t * (1.0 + torch.erf(t / "
                                "SQRT_2))")
    x = torch.linspace(-3, 3, 7)
    assert torch.allclose(_run(spec, x), torch.nn.functional.gelu(x),  # type: ignore[arg-type]
                          atol=1e-6)


def test_a_function_imported_from_a_conftest_is_carried_not_imported(tmp_path: Path) -> None:
    """The conftest also builds the extension at import: importing it in the worker
    would build it again; carrying the one function does not."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(
        GELU_REF + "from torch.utils.cpp_extension import load\n"
                   "ext = load(name='ext', sources=['gelu.cu'])\n")
    _write(tmp_path, "import torch\nfrom conftest import ext, gelu_ref as reference\n\n"
                     "def test_op():\n    x = torch.randn(8)\n"
                     "    assert_close(ext.op(x), reference(x))\n")
    spec = reference_spec(tmp_path, _ref(reference="reference(x)"))
    assert isinstance(spec, ReferenceSpec)
    assert spec.definitions[-1] == "reference = gelu_ref"
    assert not any("load" in d for d in spec.definitions)
    torch = __import__("torch")
    assert float(_run(spec, torch.zeros(1))) == 0.0  # type: ignore[arg-type]


def test_a_script_s_reference_inside_main_is_carried(tmp_path: Path) -> None:
    (tmp_path / "check.py").write_text(
        "import sys\nimport torch\nfrom torch.utils.cpp_extension import load\n\n"
        "def main():\n    ext = load(name='relu_ext', sources=['relu.cu'])\n"
        "    ref_fn = lambda t: torch.clamp(t, min=0.0)\n    x = torch.randn(100)\n"
        "    out = ext.relu(x)\n    if (out - ref_fn(x)).abs().max() > 1e-6:\n"
        "        sys.exit(1)\n\nif __name__ == '__main__':\n    main()\n")
    spec = reference_spec(tmp_path, _ref(file="check.py", test="<module>", kind="script",
                                         op="ext.relu", reference="ref_fn(x)", line=9))
    assert isinstance(spec, ReferenceSpec)
    assert spec.definitions == ("ref_fn = lambda t: torch.clamp(t, min=0.0)",)
    torch = __import__("torch")
    assert _run(spec, torch.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]  # type: ignore[attr-defined]


def test_what_cannot_be_carried_says_why(tmp_path: Path) -> None:
    cases = {
        # the reference is the op again
        "def ref(t):\n    return ext.op(t)\n": "it calls the op itself (ext)",
        # a package of the repository used as a whole
        "import mypkg\n\ndef ref(t):\n    return mypkg.gelu(t)\n":
            "it uses mypkg, a module of the repository, as a whole",
        # a name found nowhere
        "def ref(t):\n    return helper(t)\n": "helper is defined nowhere the test can see",
    }
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    for defs, why in cases.items():
        _write(tmp_path, f"from m import ext\n{defs}\ndef test_op():\n"
                         "    assert_close(ext.op(x), ref(x))\n")
        spec = reference_spec(tmp_path, _ref(reference="ref(x)"))
        assert spec == Unusable(f"the reference ref(x) cannot be carried: {why}")


def test_a_torch_op_in_the_reference_is_the_op_itself(tmp_path: Path) -> None:
    _write(tmp_path, "import torch\n\ndef test_op():\n"
                     "    assert_close(torch.ops.myns.op(x), torch.ops.myns.op(x) * 1)\n")
    spec = reference_spec(tmp_path, _ref(op="torch.ops.myns.op", op_name="op",
                                         reference="torch.ops.myns.op(x) * 1"))
    assert spec == Unusable("the reference torch.ops.myns.op(x) * 1 calls the op itself "
                            "(torch.ops.myns.op)")


def test_a_literal_argument_is_a_parameter_of_the_reference(tmp_path: Path) -> None:
    """Two tests call scale(x, 2.5) and scale(x, -3.0): each reference follows the
    argument it gets, and judges only the calls of its own test."""
    _write(tmp_path, "def test_op():\n    assert_close(ext.op(x, -3.0), x * -3.0 + 1)\n")
    spec = reference_spec(tmp_path, _ref(reference="x * -3.0 + 1"))
    assert isinstance(spec, ReferenceSpec)
    assert spec.source == "lambda x, _a1: x * _a1 + 1"
    node = "tests/test_op.py::test_op"
    assert belongs(spec.to_json(), 2, 2, (f"{node}[cuda-2]",))
    assert not belongs(spec.to_json(), 2, 2, ("tests/test_op.py::test_other",))
    assert not belongs(spec.to_json(), 2, 3, (node,))
    assert belongs(spec.to_json(), 2, 2, ())  # declared inputs: no test to tell by
    script = reference_spec(tmp_path, _ref(kind="script", test="<module>", reference="x"))
    assert isinstance(script, ReferenceSpec) and script.tests == ("tests/test_op.py",)


def test_a_function_named_as_the_reference_is_called_with_the_op_s_arguments(
    tmp_path: Path,
) -> None:
    (tmp_path / "main.py").write_text(
        "import torch\n\ndef swish_ref(x):\n    return x * torch.sigmoid(x)\n\n"
        "if __name__ == '__main__':\n    x = torch.randn(8)\n    out = ext.swish(x)\n"
        "    ref = swish_ref(x)\n    assert torch.allclose(out, ref)\n")
    spec = reference_spec(tmp_path, _ref(file="main.py", test="<module>", kind="script",
                                         op="ext.swish", reference="swish_ref", line=8))
    assert isinstance(spec, ReferenceSpec) and spec.source == "lambda x: swish_ref(x)"
    torch = __import__("torch")
    assert float(_run(spec, torch.zeros(1))) == 0.0  # type: ignore[arg-type]


def test_a_reference_judges_its_tests_calls_wherever_pytest_roots_the_ids() -> None:
    """pytest roots node ids at the folder of the nearest pyproject.toml or ini file, which
    may lie above the task's folder (a kernel package inside a larger repository)."""
    spec = {"tests": ["tests/test_rowsum.py::test_rowsum_matches_torch"]}
    named = "tests/test_rowsum.py::test_rowsum_matches_torch"
    for node in (named, f"{named}[3-float32]", f"pkgs/rowsum/{named}"):
        assert belongs(spec, 1, 1, (node,)), node
    for node in (f"x{named}", f"{named}_other", "tests/test_other.py::test_rowsum_matches_torch"):
        assert not belongs(spec, 1, 1, (node,)), node


def test_an_attribute_of_a_factorys_result_is_the_op_not_a_wrapper() -> None:
    # `ext = matmul_ops.load_ext()` then `ext.matmul(a, b)`: the scan follows the call
    # through "matmul_ops.load_ext.matmul", which is the extension's own function, so the
    # reference judges the op's calls directly; a package function stays a wrapper whose
    # calls the reference is written over.
    from kfbot.config import load_config
    from kfbot.evaluate.task import make_task
    from kfbot.scan.scanner import scan
    from kfbot.scan.select import select_kernel

    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    outers = {}
    for fixture, kernel in (("tunables_matmul", "matmul_tiled"),
                            ("pkg_chain", "swiglu_kernel"), ("naive_rows", "softmax_kernel"),
                            ("observe_pairs", "free_kernel"),
                            ("subfolder_setup", "nearest2d/nearest.cu::nearest_kernel")):
        root = fixtures / fixture
        config = load_config(None, root)
        task = make_task(select_kernel(scan(root, config).kernels, kernel), root, config)
        outers[kernel] = [r.outer for r in task.references]
    assert outers == {"matmul_tiled": [None, None],
                      "swiglu_kernel": ["fusedact.ops:swiglu", "fusedact.GatedActivation:swiglu"],
                      "softmax_kernel": ["rows:softmax"],
                      # the test calls the extension's function itself: no wrapper
                      "free_kernel": [None], "nearest2d/nearest.cu::nearest_kernel": [None]}


def test_a_factory_module_is_read_only_inside_the_repository(tmp_path: Path) -> None:
    from kfbot.evaluate.reference.spec import outer_ref

    factory = "def load_ext():\n    return None\n"
    root, outside = tmp_path / "repo", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ops.py").write_text(factory)
    ref = _ref(target="ops.load_ext.matmul")
    assert outer_ref(root, ref) is None  # the extension the factory returns: the op
    assert outer_ref(root, _ref(target="ops.matmul")) == "ops:matmul"  # a wrapper
    (root / "ops.py").unlink()
    (outside / "ops.py").write_text(factory)
    (root / "ops.py").symlink_to(outside / "ops.py")
    # a link out of the repository is not followed, so nothing marks it a factory
    assert outer_ref(root, ref) == "ops.load_ext:matmul"
