"""Reference tests become callable references (or a reason why not)."""

from __future__ import annotations

from pathlib import Path

from kfbot.evaluate.reference import ReferenceSpec, Unusable, reference_spec
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
                                 description="torch.softmax(x, dim=-1) from tests/test_op.py:6")
    fn = eval(spec.source, {"torch": __import__("torch")})
    assert fn.__code__.co_argcount == 1


def test_literal_arguments_become_placeholders(tmp_path: Path) -> None:
    _write(tmp_path, "import torch.nn.functional as F\n\ndef test_op():\n    x = w = b = 0\n"
                     "    out = ext.op(x, w, b, 1e-5)\n"
                     "    assert_close(out, F.layer_norm(x, (x.shape[-1],), w, b, 1e-5))\n")
    spec = reference_spec(tmp_path, _ref(reference="F.layer_norm(x, (x.shape[-1],), w, b, 1e-05)"))
    assert isinstance(spec, ReferenceSpec)
    assert spec.source == "lambda x, w, b, _a3: F.layer_norm(x, (x.shape[-1],), w, b, 1e-05)"
    assert spec.imports == ("import torch.nn.functional as F",)


def test_reference_using_names_the_op_does_not_get(tmp_path: Path) -> None:
    _write(tmp_path, "import torch\n\ndef test_op():\n    x = torch.randn(3)\n    s = 2.0\n"
                     "    assert_close(ext.op(x), x * s)\n")
    spec = reference_spec(tmp_path, _ref(reference="x * s"))
    assert spec == Unusable("the reference x * s uses s, which the op call does not pass")


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
