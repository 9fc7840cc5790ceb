"""kfbot.yaml discovery, strict loading with file:line messages, and path filtering."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from kfbot.config import (
    CONFIG_NAMES,
    BuildConfig,
    Config,
    ScanConfig,
    TaskConfig,
    Tolerance,
    find_config,
    load_config,
    path_included,
)
from kfbot.errors import EXIT_USAGE, KfbotError

SAMPLE = """\
version: 1
scan:
  exclude: ["third_party/**"]
tasks:
  - name: square
    kernel: square_kernel
    files: [csrc/square.cu]
    op: "square_ops:square"
    reference: "ref:square_ref"
    inputs: "inputs:make_inputs"
    shapes: [[1024], [4096, 33]]
    dtypes: [float32]
    tolerances:
      float32: {atol: 1.0e-6, rtol: 1.0e-6}
"""


def write(root: Path, text: str, name: str = "kfbot.yaml") -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(root: Path, text: str) -> str:
    write(root, text)
    with pytest.raises(KfbotError) as info:
        load_config(None, root)
    assert info.value.exit_code == EXIT_USAGE
    return str(info.value)


def task_error(root: Path, task_body: str) -> str:
    """The error for a file whose only task has `name: t` plus `task_body` (from line 3)."""
    body = textwrap.indent(textwrap.dedent(task_body), "    ")
    return load_error(root, "tasks:\n  - name: t\n" + body)


# ---- valid files -----------------------------------------------------------------------


def test_sample_file_loads_into_records(tmp_path: Path) -> None:
    write(tmp_path, SAMPLE)
    config = load_config(None, tmp_path)
    square = TaskConfig(
        name="square",
        kernel="square_kernel",
        files=("csrc/square.cu",),
        op="square_ops:square",
        reference="ref:square_ref",
        inputs="inputs:make_inputs",
        shapes=((1024,), (4096, 33)),
        dtypes=("float32",),
        tolerances={"float32": Tolerance(atol=1e-6, rtol=1e-6)},
    )
    assert config == Config(scan=ScanConfig(exclude=("third_party/**",)), tasks=(square,))
    assert config.path == "kfbot.yaml"
    assert config.tasks[0].line == 5


def test_build_section_and_number_forms(tmp_path: Path) -> None:
    write(
        tmp_path,
        """\
        tasks:
          - name: t
            in_place: true
            tolerances:
              bfloat16: {atol: 1, rtol: 1e-2}
            build:
              kind: load_inline
              name: ext
              sources: [a.cu]
              defines: {VEC: 0x10, MODE: fast, SCALE: 1.5}
              extra_cuda_cflags: [-O3]
        """,
    )
    task = load_config(None, tmp_path).tasks[0]
    assert task.in_place is True
    # An int is accepted as a float, and so is YAML 1.1's dotless `1e-2` (a string there).
    assert task.tolerances == {"bfloat16": Tolerance(atol=1.0, rtol=0.01)}
    assert isinstance(task.tolerances["bfloat16"].atol, float)
    # Define values keep the text as written, so the compiler sees `-DVEC=0x10`.
    assert task.build == BuildConfig(
        kind="load_inline",
        name="ext",
        sources=("a.cu",),
        defines={"VEC": "0x10", "MODE": "fast", "SCALE": "1.5"},
        extra_cuda_cflags=("-O3",),
    )


def test_aliases_are_followed(tmp_path: Path) -> None:
    write(
        tmp_path,
        """\
        tasks:
          - name: a
            tolerances: &tol
              float16: {atol: 0.01, rtol: 0.01}
          - name: b
            tolerances: *tol
        """,
    )
    a, b = load_config(None, tmp_path).tasks
    assert a.tolerances == b.tolerances == {"float16": Tolerance(0.01, 0.01)}
    assert (a.line, b.line) == (2, 5)


def test_defaults_without_a_config_file(tmp_path: Path) -> None:
    config = load_config(None, tmp_path)
    assert config == Config(version=1, scan=ScanConfig(), tasks=())
    assert config.path is None


@pytest.mark.parametrize("text", ["", "# nothing configured yet\n", "---\n"])
def test_empty_file_gives_defaults(tmp_path: Path, text: str) -> None:
    write(tmp_path, text)
    config = load_config(None, tmp_path)
    assert config == Config()
    assert config.path == "kfbot.yaml"


def test_explicit_path_outside_root_is_shown_as_given(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    path = write(tmp_path, "version: 1\n", name="elsewhere.yaml")
    assert load_config(path, root).path == str(path)
    write(tmp_path, "version: 2\n", name="elsewhere.yaml")
    with pytest.raises(KfbotError, match=rf"^{re.escape(str(path))}:1: version: "):
        load_config(path, root)


# ---- errors: each names file:line and the key ------------------------------------------


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    message = task_error(tmp_path, "kernel: k\ntolerence: {}\n")
    assert message == "kfbot.yaml:4: tasks[0].tolerence: unknown key (did you mean 'tolerances'?)"


def test_unknown_key_without_close_match_lists_the_keys(tmp_path: Path) -> None:
    message = load_error(tmp_path, "scan:\n  paths: [a]\n")
    assert message == "kfbot.yaml:2: scan.paths: unknown key (expected one of: include, exclude)"


def test_loader_set_fields_are_not_keys(tmp_path: Path) -> None:
    assert load_error(tmp_path, "path: x.yaml\n").startswith("kfbot.yaml:1: path: unknown key")
    assert task_error(tmp_path, "line: 3\n").startswith("kfbot.yaml:3: tasks[0].line: unknown key")


def test_wrong_type_names_the_element(tmp_path: Path) -> None:
    message = task_error(tmp_path, "shapes:\n  - [4]\n  - [abc, 2]\n")
    assert message == "kfbot.yaml:5: tasks[0].shapes[1][0]: expected an integer, got 'abc'"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("files: csrc/a.cu\n", "kfbot.yaml:3: tasks[0].files: expected a list, got 'csrc/a.cu'"),
        ("kernel: [k]\n", "kfbot.yaml:3: tasks[0].kernel: expected a string, got a list"),
        ("in_place: 1\n", "kfbot.yaml:3: tasks[0].in_place: expected true or false, got 1"),
        ("build: yes\n", "kfbot.yaml:3: tasks[0].build: expected a mapping, got yes"),
        (
            "kernel: 12\n",
            "kfbot.yaml:3: tasks[0].kernel: "
            "expected a string, got 12 (quote it to make it a string)",
        ),
        (
            "tolerances: {float32: {atol: '0.1', rtol: 0}}\n",
            "kfbot.yaml:3: tasks[0].tolerances.float32.atol: expected a number, got '0.1'",
        ),
    ],
)
def test_wrong_types(tmp_path: Path, body: str, expected: str) -> None:
    assert task_error(tmp_path, body) == expected


def test_bool_is_not_an_int(tmp_path: Path) -> None:
    message = task_error(tmp_path, "shapes: [[8, true]]\n")
    assert message == "kfbot.yaml:3: tasks[0].shapes[0][1]: expected an integer, got true"
    message = load_error(tmp_path, "version: true\n")
    assert message == "kfbot.yaml:1: version: expected an integer, got true"


def test_bool_is_not_a_define_value(tmp_path: Path) -> None:
    message = task_error(tmp_path, "build:\n  kind: load\n  name: e\n  defines: {DEBUG: on}\n")
    expected = "expected a string or a number, got on"
    assert message == f"kfbot.yaml:6: tasks[0].build.defines.DEBUG: {expected}"


def test_missing_required_key_points_at_the_mapping(tmp_path: Path) -> None:
    message = load_error(tmp_path, "tasks:\n  - name: a\n  - kernel: k\n    files: [x.cu]\n")
    assert message == "kfbot.yaml:3: tasks[1]: missing required key 'name'"
    message = task_error(tmp_path, "build:\n  name: ext\n")
    assert message == "kfbot.yaml:4: tasks[0].build: missing required key 'kind'"


def test_duplicate_key(tmp_path: Path) -> None:
    message = task_error(tmp_path, "kernel: a\ndtypes: [float32]\nkernel: b\n")
    assert message == "kfbot.yaml:5: tasks[0].kernel: duplicate key (first at line 3)"


def test_duplicate_task_name(tmp_path: Path) -> None:
    message = load_error(tmp_path, "tasks:\n  - name: a\n  - name: b\n  - name: a\n")
    assert message == "kfbot.yaml:4: tasks[2].name: duplicate task name 'a' (first at line 2)"


def test_non_string_key(tmp_path: Path) -> None:
    message = task_error(tmp_path, "tolerances:\n  1: {atol: 0, rtol: 0}\n")
    assert message == "kfbot.yaml:4: tasks[0].tolerances: expected a string key, got 1"


def test_bad_dtype_in_list_and_as_tolerance_key(tmp_path: Path) -> None:
    message = task_error(tmp_path, "dtypes: [float16, flaot32]\n")
    expected = "unknown dtype 'flaot32' (did you mean 'float32'?)"
    assert message == f"kfbot.yaml:3: tasks[0].dtypes[1]: {expected}"
    message = task_error(tmp_path, "tolerances:\n  half: {atol: 0, rtol: 0}\n")
    assert message.startswith("kfbot.yaml:4: tasks[0].tolerances.half: unknown dtype 'half' (")


def test_negative_tolerance(tmp_path: Path) -> None:
    message = task_error(tmp_path, "tolerances:\n  int8: {atol: -1, rtol: 0}\n")
    expected = "expected a finite number >= 0, got -1.0"
    assert message == f"kfbot.yaml:4: tasks[0].tolerances.int8.atol: {expected}"


@pytest.mark.parametrize("ref", ["square_ops.square", "square_ops:", ":f", "a b:f", "1mod:f"])
def test_bad_callable_reference(tmp_path: Path, ref: str) -> None:
    message = task_error(tmp_path, f"reference: {ref!r}\n")
    expected = f"expected 'module.path:callable', got {ref!r}"
    assert message == f"kfbot.yaml:3: tasks[0].reference: {expected}"


def test_dotted_callable_reference_is_fine(tmp_path: Path) -> None:
    write(tmp_path, "tasks:\n  - name: t\n    op: pkg.ops:Square.forward\n")
    assert load_config(None, tmp_path).tasks[0].op == "pkg.ops:Square.forward"


def test_bad_build_kind_suggests(tmp_path: Path) -> None:
    message = task_error(tmp_path, "build:\n  kind: setup.py\n  name: e\n")
    assert message == (
        "kfbot.yaml:4: tasks[0].build.kind: unknown value 'setup.py' (did you mean 'setup_py'?)"
    )


def test_bad_version(tmp_path: Path) -> None:
    message = load_error(tmp_path, "# config\nversion: 2\n")
    assert message == "kfbot.yaml:2: version: unsupported version 2 (only version 1 is supported)"


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    assert load_error(tmp_path, "- a\n- b\n") == "kfbot.yaml:1: expected a mapping, got a list"


def test_yaml_syntax_error_has_the_line(tmp_path: Path) -> None:
    message = load_error(tmp_path, "version: 1\nscan: x\n  include: []\n")
    assert message == "kfbot.yaml:3: invalid YAML: mapping values are not allowed here"
    message = load_error(tmp_path, "version: 1\ntasks:\n  - name: [a\n  - name: b\n")
    assert message.startswith("kfbot.yaml:4: invalid YAML: while parsing a flow sequence, ")


def test_two_documents_are_a_syntax_error(tmp_path: Path) -> None:
    message = load_error(tmp_path, "version: 1\n---\nversion: 1\n")
    assert message == (
        "kfbot.yaml:2: invalid YAML: "
        "expected a single document in the stream, but found another document"
    )


def test_forbidden_character_has_the_line(tmp_path: Path) -> None:
    message = load_error(tmp_path, "version: 1\ntasks: []\n# \x07\n")
    assert message == (
        "kfbot.yaml:3: invalid YAML: special characters are not allowed (character U+0007)"
    )


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../other/a.cu", "path must not contain '..', got '../other/a.cu'"),
        ("csrc/../../a.cu", "path must not contain '..', got 'csrc/../../a.cu'"),
        ("/abs/a.cu", "expected a path relative to the repository root, got '/abs/a.cu'"),
        ("C:/a.cu", "expected a path relative to the repository root, got 'C:/a.cu'"),
    ],
)
def test_files_must_stay_inside_the_repository(tmp_path: Path, path: str, problem: str) -> None:
    message = task_error(tmp_path, f"files:\n  - ok.cu\n  - {path!r}\n")
    assert message == f"kfbot.yaml:5: tasks[0].files[1]: {problem}"


def test_shape_dimensions_must_be_positive(tmp_path: Path) -> None:
    message = task_error(tmp_path, "shapes: [[16, 0]]\n")
    assert message == "kfbot.yaml:3: tasks[0].shapes[0][1]: expected a positive integer, got 0"
    message = task_error(tmp_path, "shapes:\n  - [-4]\n")
    assert message == "kfbot.yaml:4: tasks[0].shapes[0][0]: expected a positive integer, got -4"


def test_shape_must_not_be_empty(tmp_path: Path) -> None:
    message = task_error(tmp_path, "shapes: [[8], []]\n")
    assert message == "kfbot.yaml:3: tasks[0].shapes[1]: must not be empty"


def test_unreadable_explicit_path(tmp_path: Path) -> None:
    with pytest.raises(KfbotError, match=r"^missing\.yaml: cannot read: "):
        load_config(tmp_path / "missing.yaml", tmp_path)


# ---- discovery -------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_each_name_is_discovered(tmp_path: Path, name: str) -> None:
    write(tmp_path, "tasks:\n  - name: t\n", name=name)
    assert find_config(tmp_path) == tmp_path / name
    config = load_config(None, tmp_path)
    assert config.path == name
    assert [task.name for task in config.tasks] == ["t"]


def test_nothing_to_discover(tmp_path: Path) -> None:
    (tmp_path / "kfbot.yaml").mkdir()  # a directory is not a config file
    assert find_config(tmp_path) is None


def test_two_config_files_are_an_error(tmp_path: Path) -> None:
    write(tmp_path, "version: 1\n", name="kfbot.yml")
    write(tmp_path, "version: 1\n", name=".github/kfbot.yaml")
    with pytest.raises(KfbotError) as info:
        find_config(tmp_path)
    assert "kfbot.yml and .github/kfbot.yaml" in str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    with pytest.raises(KfbotError, match=r"kfbot\.yml and \.github/kfbot\.yaml"):
        load_config(None, tmp_path)


def test_discovery_errors_are_reported_relative_to_root(tmp_path: Path) -> None:
    write(tmp_path, "tasks:\n  - name: t\n    dtype: [float32]\n", name=".github/kfbot.yml")
    with pytest.raises(KfbotError) as info:
        load_config(None, tmp_path)
    assert str(info.value) == (
        ".github/kfbot.yml:3: tasks[0].dtype: unknown key (did you mean 'dtypes'?)"
    )


# ---- include / exclude -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("include", "exclude", "path", "expected"),
    [
        ((), (), "anything/at/all.cu", True),
        ((), ("third_party/**",), "third_party/x.cu", False),
        ((), ("third_party/**",), "third_party/sub/y.cu", False),
        ((), ("third_party/**",), "src/third_party/x.cu", True),
        ((), ("third_party/**",), "third_party_extra/x.cu", True),
        ((), ("third_party",), "third_party/sub/y.cu", False),
        ((), ("*.cu",), "top.cu", False),
        ((), ("*.cu",), "csrc/deep.cu", True),  # `*` stays in one segment
        ((), ("**/*.cu",), "csrc/deep.cu", False),
        ((), ("**/*.cu",), "top.cu", False),  # `**` may match no directories
        ((), ("**/*.cu",), "csrc/deep.cuh", True),
        (("csrc/**",), (), "csrc/a/b/k.cu", True),
        (("csrc/**",), (), "tests/k.cu", False),
        (("csrc/*.cu",), (), "csrc/k.cu", True),
        (("csrc/*.cu",), (), "csrc/sub/k.cu", False),
        (("src/**/kernels/*.cu",), (), "src/kernels/a.cu", True),
        (("src/**/kernels/*.cu",), (), "src/x/y/kernels/a.cu", True),
        (("src/**/kernels/*.cu",), (), "src/x/y/other/a.cu", False),
        (("csrc/**",), ("csrc/legacy/**",), "csrc/legacy/old.cu", False),  # exclude wins
        (("csrc/**",), ("csrc/legacy/**",), "csrc/new.cu", True),
        (("./csrc/**",), (), "./csrc/k.cu", True),
        (("k?.cu",), (), "k1.cu", True),
        (("k?.cu",), (), "K1.cu", False),  # case-sensitive everywhere
    ],
)
def test_path_included(
    include: tuple[str, ...], exclude: tuple[str, ...], path: str, expected: bool
) -> None:
    config = ScanConfig(include=include, exclude=exclude)
    assert path_included(config, path) is expected


def test_loaded_patterns_drive_path_included(tmp_path: Path) -> None:
    write(tmp_path, SAMPLE)
    scan = load_config(None, tmp_path).scan
    assert not path_included(scan, "third_party/cutlass/gemm.cu")
    assert path_included(scan, "csrc/square.cu")


def test_empty_pattern_is_rejected(tmp_path: Path) -> None:
    message = load_error(tmp_path, "scan:\n  include: ['csrc/**', '']\n")
    assert message == "kfbot.yaml:2: scan.include[1]: must not be empty"


def test_task_flops_expression(tmp_path: Path) -> None:
    (tmp_path / "kfbot.yaml").write_text(
        "tasks:\n  - name: mm\n    kernel: matmul_tiled\n"
        "    flops: \"2 * args[0].shape[0] * args[0].shape[1] * args[1].shape[1]\"\n")
    (task,) = load_config(None, tmp_path).tasks
    assert task.flops == "2 * args[0].shape[0] * args[0].shape[1] * args[1].shape[1]"


def test_github_section_loads_and_rejects_unknown_keys(tmp_path: Path) -> None:
    (tmp_path / "kfbot.yaml").write_text(
        "github:\n  labels: [perf]\n  min_permission: maintain\n  max_open_prs: 2\n")
    gh = load_config(None, tmp_path).github
    assert (gh.labels, gh.min_permission, gh.max_open_prs, gh.allow_forks) == \
        (("perf",), "maintain", 2, False)
    (tmp_path / "kfbot.yaml").write_text("github:\n  min_permision: write\n")
    with pytest.raises(KfbotError, match=r"kfbot.yaml:2: github.min_permision: unknown key"):
        load_config(None, tmp_path)
    (tmp_path / "kfbot.yaml").write_text("github:\n  min_speedup: 0.5\n")
    with pytest.raises(KfbotError, match=r"at least 1\.0"):
        load_config(None, tmp_path)


def test_review_gate_is_draft_or_block(tmp_path: Path) -> None:
    assert load_config(None, tmp_path).github.review_gate == "draft"
    (tmp_path / "kfbot.yaml").write_text("github:\n  review_gate: block\n")
    assert load_config(None, tmp_path).github.review_gate == "block"
    (tmp_path / "kfbot.yaml").write_text("github:\n  review_gate: maybe\n")
    with pytest.raises(KfbotError, match=r"kfbot.yaml:2: github.review_gate") as raised:
        load_config(None, tmp_path)
    assert "draft" in str(raised.value) and "block" in str(raised.value)
