"""The publish job's re-check on its own: patches as `kfbot optimize` writes them apply
exactly; anything else that could slip a change past it is refused with a reason."""

from __future__ import annotations

import pytest
from test_publish import _evaluation

from kfbot.evaluate.candidate import content_hash
from kfbot.github.handoff import Publication, patch_digest
from kfbot.github.recheck import BaseFile, Checked, Refusal, recheck
from kfbot.search.outcome.report import unified_patch

OLD = "int a;\nint b;\nint c;\n"


def _publication(files: dict[str, str], patch: str, root: str = "",
                 editable: tuple[str, ...] | None = None) -> Publication:
    candidate = content_hash(files, {})
    return Publication("k.cu::k", "k", "a" * 40, root, editable or tuple(files),
                       tuple(sorted(files)), candidate, patch_digest(patch),
                       _evaluation(1.5, candidate), None)


@pytest.mark.parametrize("new", [
    "int a;\nint B;\nint c;\n",  # an edit in the middle
    "int a;\nint b;\nint c;",  # the last newline removed
    "int a;\r\nint b;\nint c;\nint d;\n",  # CRLF kept, a line added at the end
    "// first\n" + OLD,  # an insertion at the top
])
def test_a_patch_as_kfbot_writes_it_applies_exactly(new: str) -> None:
    patch = unified_patch({"k.cu": OLD}, {"k.cu": new})
    found = recheck("p", _publication({"k.cu": new}, patch), patch,
                    {"k.cu": BaseFile("100644", OLD)})
    assert isinstance(found, Checked)
    assert [(c.path, c.text) for c in found.changes] == [("k.cu", new)]


def test_a_task_in_a_subfolder_and_an_untouched_candidate_file() -> None:
    files = {"k.cu": "int z;\n", "k.cuh": "// header\n"}
    patch = unified_patch({"k.cu": OLD}, {"k.cu": "int z;\n"})
    base = {"sub/k.cu": BaseFile("100755", OLD), "sub/k.cuh": BaseFile("100644", "// header\n")}
    found = recheck("p", _publication(files, patch, root="sub/"), patch, base)
    assert isinstance(found, Checked)
    assert [(c.path, c.mode) for c in found.changes] == [("sub/k.cu", "100755")]


def test_a_new_file_is_created_only_where_the_base_has_none() -> None:
    patch = unified_patch({"k.cu": None}, {"k.cu": "int n;\n"})
    pub = _publication({"k.cu": "int n;\n"}, patch)
    created = recheck("p", pub, patch, {"k.cu": BaseFile(None, None)})
    assert isinstance(created, Checked) and created.changes[0].mode == "100644"
    refused = recheck("p", pub, patch, {"k.cu": BaseFile("100644", OLD)})
    assert isinstance(refused, Refusal) and "the base commit has such file" in refused.reason


@pytest.mark.parametrize(("header", "reason"), [
    ("diff --git a/k.cu b/k.cu\nrename from o.cu\nrename to k.cu\n", "plain text edits only"),
    ("diff --git a/k.cu b/k.cu\nold mode 100644\nnew mode 100755\n", "plain text edits only"),
    ("diff --git a/k.cu b/k.cu\nBinary files a/k.cu and b/k.cu differ\n",
     "plain text edits only"),
    ("diff --git a/o.cu b/k.cu\n--- a/o.cu\n+++ b/k.cu\n@@ -1 +1 @@\n-x\n+y\n",
     "names its file inconsistently"),
    ("diff --git a/k.cu b/k.cu\n--- a/k.cu\n+++ b/k.cu\n@@ -1,2 +1,2 @@\n-int a;\n+int q;\n",
     "line counts do not match"),
])
def test_what_is_not_a_plain_edit_is_refused(header: str, reason: str) -> None:
    found = recheck("p", _publication({"k.cu": "int q;\n"}, header), header,
                    {"k.cu": BaseFile("100644", OLD)})
    assert isinstance(found, Refusal) and reason in found.reason


def test_a_link_in_the_base_is_not_written_through() -> None:
    patch = unified_patch({"k.cu": OLD}, {"k.cu": "int z;\n"})
    found = recheck("p", _publication({"k.cu": "int z;\n"}, patch), patch,
                    {"k.cu": BaseFile("120000", None)})
    assert isinstance(found, Refusal) and "not a regular file in the base commit" in found.reason
