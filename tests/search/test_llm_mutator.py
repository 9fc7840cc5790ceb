"""The LLM mutator against a local fake of the Messages API, edit blocks and personas."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_anthropic import FakeAnthropic, Reply

from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.search.budget import Budget, Limits
from kfbot.search.mutators.edits import Edit, EditError, apply_edits, parse_edits
from kfbot.search.mutators.llm import (
    DIAGNOSES,
    META_HINTS,
    NO_KEY_NOTICE,
    LlmMutator,
    LlmSettings,
    PromptContext,
    load_personas,
    mutate_meta_prompt,
    persona_for,
)

KERNEL = """\
#include <cuda_runtime.h>

__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = x[i] * 2.0f;
    }
}
"""
PATH = "csrc/scale.cu"
GOOD_ANSWER = f"""\
Use a grid-stride loop so each thread handles several elements and the launch can be
smaller.

{PATH}
<<<<<<< SEARCH
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{
        y[i] = x[i] * 2.0f;
    }}
=======
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {{
        y[i] = x[i] * 2.0f;
    }}
>>>>>>> REPLACE
"""
TASK = "Op scale: y = 2 * x for x float32 of shape (4096,); reference torch.mul(x, 2)."


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


def _settings(fake: FakeAnthropic, **kw: object) -> LlmSettings:
    values: dict[str, object] = {"base_url": fake.base_url, "max_retries": 0, "timeout_s": 5.0,
                                 "max_tokens": 1234}
    values.update(kw)
    return LlmSettings(**values)  # type: ignore[arg-type]


def _ctx(**kw: object) -> PromptContext:
    values: dict[str, object] = {
        "task": TASK, "diagnosis": "memory-bound", "parent_files": {PATH: KERNEL},
        "diagnostics": ["ptxas info: Used 8 registers"],
        "failures": ["abc123: wrong results at index 17"],
        "lessons": ["grid-stride loops helped elementwise ops on H100"],
        "meta_prompt": "Prefer changes to memory access patterns over arithmetic changes.",
        "editable": [PATH]}
    values.update(kw)
    return PromptContext(**values)  # type: ignore[arg-type]


def _mutator(fake: FakeAnthropic, budget: Budget | None = None, **kw: object) -> LlmMutator:
    return LlmMutator(_settings(fake, **kw), budget or Budget(Limits()), api_key="test-key")


PARENT = Candidate(files={}, params={"BLOCK": "256"}, origin="params")


# ---------------------------------------------------------------------------- the mutator

def test_good_reply_gives_candidate_and_charges_budget(fake: FakeAnthropic) -> None:
    fake.script(Reply.text(GOOD_ANSWER, input_tokens=1000, output_tokens=200,
                           cache_creation_input_tokens=400, cache_read_input_tokens=2000))
    budget = Budget(Limits())
    proposal = _mutator(fake, budget).propose(_ctx(), PARENT)

    assert proposal.rejected is None
    cand = proposal.candidate
    assert cand is not None
    assert cand.origin == "llm" and cand.parent == PARENT.hash
    assert cand.params == PARENT.params
    assert "i += gridDim.x * blockDim.x" in cand.files[PATH]
    assert "if (i < n)" not in cand.files[PATH]
    assert cand.files[PATH].startswith("#include <cuda_runtime.h>\n")
    assert cand.rationale.startswith("Use a grid-stride loop")
    assert len(cand.rationale) <= 300 and "\n" not in cand.rationale

    assert len(fake.requests) == 1
    req = fake.requests[0]
    assert req.path == "/v1/messages"
    assert req.headers["authorization"] == "Bearer test-key"
    body = req.body
    assert body["model"] == "claude-sonnet-5-5" and body["max_tokens"] == 1234
    assert "temperature" not in body  # API 2026-10-21 rejects sampling parameters
    [system] = body["system"]
    assert system["type"] == "text"
    assert system["cache_control"] == {"type": "ephemeral"}
    assert persona_for("memory-bound").persona in system["text"]
    assert "<<<<<<< SEARCH" in system["text"] and ">>>>>>> REPLACE" in system["text"]
    [message] = body["messages"]
    assert message["role"] == "user"
    user = message["content"]
    assert isinstance(user, str)
    for part in (TASK, KERNEL.rstrip(), "abc123: wrong results at index 17",
                 "grid-stride loops helped elementwise ops on H100", "Used 8 registers",
                 "Prefer changes to memory access patterns"):
        assert part in user

    tokens = 1000 + 200 + 400 + 2000
    usd = (1000 * 3.0 + 400 * 3.0 * 1.25 + 2000 * 3.0 * 0.1 + 200 * 15.0) / 1e6
    assert budget.tokens == tokens
    assert budget.usd == pytest.approx(usd)
    assert proposal.usage.tokens == tokens and proposal.usage.usd == pytest.approx(usd)


def test_persona_follows_diagnosis(fake: FakeAnthropic) -> None:
    fake.script(Reply.text(GOOD_ANSWER), Reply.text(GOOD_ANSWER))
    mutator = _mutator(fake)
    mutator.propose(_ctx(diagnosis="reduction-heavy"), PARENT)
    mutator.propose(_ctx(diagnosis="something-new"), PARENT)
    first, second = (r.body["system"][0]["text"] for r in fake.requests)
    assert persona_for("reduction-heavy").persona in first
    assert persona_for("unknown").persona in second


def test_null_cache_usage_is_zero(fake: FakeAnthropic) -> None:
    fake.script(Reply.text(GOOD_ANSWER, input_tokens=10, output_tokens=5))
    budget = Budget(Limits())
    _mutator(fake, budget).propose(_ctx(), PARENT)
    assert budget.tokens == 15
    assert budget.usd == pytest.approx((10 * 3.0 + 5 * 15.0) / 1e6)


def test_search_text_not_in_file_is_rejected(fake: FakeAnthropic) -> None:
    answer = f"Try it.\n\n{PATH}\n<<<<<<< SEARCH\n    y[i] = x[i] * 3.0f;\n=======\n" \
             "    y[i] = x[i] + x[i];\n>>>>>>> REPLACE\n"
    fake.script(Reply.text(answer, input_tokens=7, output_tokens=3))
    budget = Budget(Limits())
    proposal = _mutator(fake, budget).propose(_ctx(), PARENT)
    assert proposal.candidate is None
    assert proposal.rejected is not None
    assert "SEARCH text not found" in proposal.rejected
    assert "y[i] = x[i] * 3.0f;" in proposal.rejected
    assert "\n" not in proposal.rejected
    assert budget.tokens == 10  # the call was made and paid for


def test_edit_of_non_editable_file_is_rejected(fake: FakeAnthropic) -> None:
    answer = GOOD_ANSWER.replace(PATH, "csrc/other.cu")
    fake.script(Reply.text(answer))
    proposal = _mutator(fake).propose(
        _ctx(parent_files={PATH: KERNEL, "csrc/other.cu": KERNEL}), PARENT)
    assert proposal.candidate is None
    assert proposal.rejected is not None
    assert "csrc/other.cu is not editable" in proposal.rejected


def test_answer_without_edits_is_rejected(fake: FakeAnthropic) -> None:
    fake.script(Reply.text("I think the kernel is already optimal."))
    proposal = _mutator(fake).propose(_ctx(), PARENT)
    assert proposal.candidate is None
    assert proposal.rejected is not None and "no edits" in proposal.rejected


def test_rate_limit_is_retried_by_the_sdk(fake: FakeAnthropic) -> None:
    fake.script(Reply.error(429, "slow down", retry_after="0"), Reply.text(GOOD_ANSWER))
    proposal = _mutator(fake, max_retries=2).propose(_ctx(), PARENT)
    assert len(fake.requests) == 2
    assert proposal.rejected is None and proposal.candidate is not None
    assert fake.requests[1].headers.get("x-stainless-retry-count") == "1"


def test_overloaded_every_try_is_a_rejection_not_an_exception(fake: FakeAnthropic) -> None:
    fake.default = Reply.error(529, "Overloaded", retry_after="0")
    budget = Budget(Limits())
    proposal = _mutator(fake, budget, max_retries=2).propose(_ctx(), PARENT)
    assert len(fake.requests) == 3
    assert proposal.candidate is None
    assert proposal.rejected is not None
    assert proposal.rejected.startswith("llm error: ")
    assert "overloaded_error" in proposal.rejected and "529" in proposal.rejected
    assert budget.tokens == 0 and budget.usd == 0.0


def test_timeout_is_a_quick_rejection(fake: FakeAnthropic) -> None:
    fake.script(Reply.text(GOOD_ANSWER, delay_s=10.0))
    budget = Budget(Limits())
    started = time.monotonic()
    proposal = _mutator(fake, budget, timeout_s=0.3, max_retries=0).propose(_ctx(), PARENT)
    assert time.monotonic() - started < 3.0
    assert proposal.candidate is None
    assert proposal.rejected is not None
    assert proposal.rejected.startswith("llm error: APITimeoutError")
    assert budget.tokens == 0


def test_exhausted_budget_makes_no_call(fake: FakeAnthropic) -> None:
    budget = Budget(Limits(tokens=10))
    budget.charge(tokens=10)
    proposal = _mutator(fake, budget).propose(_ctx(), PARENT)
    assert proposal.candidate is None
    assert proposal.rejected is not None and "LLM tokens spent" in proposal.rejected
    assert fake.requests == []


def test_from_env_without_key_is_off_with_one_notice(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert LlmMutator.from_env(LlmSettings(), Budget(Limits())) is None
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == NO_KEY_NOTICE + "\n"
    assert captured.err.startswith("llm mutator off: ANTHROPIC_API_KEY is not set")


def test_from_env_with_key(monkeypatch: pytest.MonkeyPatch, fake: FakeAnthropic) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    mutator = LlmMutator.from_env(_settings(fake), Budget(Limits()))
    assert mutator is not None
    fake.script(Reply.text(GOOD_ANSWER))
    assert mutator.propose(_ctx(), PARENT).candidate is not None
    assert fake.requests[0].headers["authorization"] == "Bearer env-key"


# ---------------------------------------------------------------------------- edit blocks

def _block(path: str, search: str, replace: str) -> str:
    return f"{path}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_exact_edit() -> None:
    edits = parse_edits("Rationale.\n\n" + _block(PATH, "        y[i] = x[i] * 2.0f;\n",
                                                  "        y[i] = x[i] + x[i];\n"))
    assert edits == [Edit(PATH, "        y[i] = x[i] * 2.0f;\n", "        y[i] = x[i] + x[i];\n")]
    out = apply_edits({PATH: KERNEL}, edits, [PATH])
    assert out == {PATH: KERNEL.replace("x[i] * 2.0f", "x[i] + x[i]")}


def test_whitespace_tolerant_edit_keeps_file_indentation() -> None:
    # The model lost the indentation and added trailing spaces.
    search = "if (i < n) {   \ny[i] = x[i] * 2.0f;\n}\n"
    replace = "if (i < n) {\n    y[i] = __fmul_rn(x[i], 2.0f);\n}\n"
    out = apply_edits({PATH: KERNEL}, parse_edits(_block(PATH, search, replace)), [PATH])
    assert "    if (i < n) {\n        y[i] = __fmul_rn(x[i], 2.0f);\n    }\n" in out[PATH]


def test_ambiguous_edit() -> None:
    text = "a = 1;\nb = 2;\na = 1;\n"
    with pytest.raises(EditError, match=r"ambiguous: it occurs 2 times \(at lines 1, 3\)"):
        apply_edits({"k.cu": text}, parse_edits(_block("k.cu", "a = 1;\n", "a = 3;\n")),
                    ["k.cu"])
    with pytest.raises(EditError, match="ambiguous: ignoring whitespace"):
        apply_edits({"k.cu": "  a = 1;\n a = 1;\n"},
                    parse_edits(_block("k.cu", "a = 1;\n", "a = 3;\n")), ["k.cu"])


def test_not_found_names_the_missing_line() -> None:
    with pytest.raises(EditError, match=r"SEARCH text not found: .*'z = 9;'"):
        apply_edits({"k.cu": "a = 1;\n"},
                    parse_edits(_block("k.cu", "a = 1;\nz = 9;\n", "")), ["k.cu"])
    with pytest.raises(EditError, match="not together in this order"):
        apply_edits({"k.cu": "a = 1;\nb = 2;\n"},
                    parse_edits(_block("k.cu", "b = 2;\na = 1;\n", "")), ["k.cu"])


def test_malformed_blocks() -> None:
    with pytest.raises(EditError, match="missing '======='"):
        parse_edits("k.cu\n<<<<<<< SEARCH\na = 1;\n>>>>>>> REPLACE\n")
    with pytest.raises(EditError, match="missing '>>>>>>> REPLACE'"):
        parse_edits("k.cu\n<<<<<<< SEARCH\na = 1;\n=======\na = 2;\n")
    with pytest.raises(EditError, match="no file path"):
        parse_edits("<<<<<<< SEARCH\na = 1;\n=======\na = 2;\n>>>>>>> REPLACE\n")
    with pytest.raises(EditError, match="no edits"):
        apply_edits({"k.cu": "a\n"}, parse_edits("nothing to change"), ["k.cu"])
    with pytest.raises(EditError, match="not editable"):
        apply_edits({"k.cu": "a\n"}, [Edit("setup.py", "a\n", "b\n")], ["k.cu"])


def test_multiple_files_fences_and_same_file_follow_ups() -> None:
    files = {"a.cu": "int a = 1;\nint b = 2;\n", "b.cuh": "#define N 4\n", "c.cu": "x\n"}
    answer = (
        "Two changes.\n\n"
        "a.cu\n```cuda\n<<<<<<< SEARCH\nint a = 1;\n=======\nint a = 10;\n>>>>>>> REPLACE\n"
        "<<<<<<< SEARCH\nint b = 2;\n=======\nint b = 20;\n>>>>>>> REPLACE\n```\n\n"
        "`./b.cuh`\n```\n<<<<<<< SEARCH\n#define N 4\n=======\n#define N 8\n>>>>>>> REPLACE\n```\n")
    edits = parse_edits(answer)
    assert [e.path for e in edits] == ["a.cu", "a.cu", "b.cuh"]
    out = apply_edits(files, edits, ["a.cu", "b.cuh", "c.cu"])
    assert out == {"a.cu": "int a = 10;\nint b = 20;\n", "b.cuh": "#define N 8\n"}


def test_new_file_and_no_final_newline() -> None:
    out = apply_edits({"k.cu": "a = 1;"},
                      [Edit("new.cuh", "", "#pragma once\n"), Edit("k.cu", "a = 1;\n", "a = 2;\n")],
                      ["k.cu", "new.cuh"])
    assert out == {"new.cuh": "#pragma once\n", "k.cu": "a = 2;"}
    with pytest.raises(EditError, match="change nothing"):
        apply_edits({"k.cu": "a\n"}, [Edit("k.cu", "a\n", "a\n")], ["k.cu"])


# ---------------------------------------------------------------------------- personas

def test_shipped_personas_cover_every_diagnosis() -> None:
    personas = load_personas()
    assert {p.when for p in personas.values()} == set(DIAGNOSES)
    for diagnosis in DIAGNOSES:
        persona = persona_for(diagnosis, personas)
        assert persona.when == diagnosis
        assert 2 <= persona.persona.count(". ") + 1 <= 6
    assert "coalesc" in persona_for("memory-bound").persona
    assert "shfl" in persona_for("reduction-heavy").persona


def _write(tmp_path: Path, extra: str) -> Path:
    base = "".join(f"- id: p-{d}\n  when: {d}\n  persona: Expert for {d}. Does things.\n"
                   for d in DIAGNOSES)
    path = tmp_path / "personas.yaml"
    path.write_text(base + extra, encoding="utf-8")
    return path


def test_bad_persona_files_name_file_and_id(tmp_path: Path) -> None:
    assert len(load_personas(_write(tmp_path, ""))) == len(DIAGNOSES)
    bad = _write(tmp_path, "- id: odd-one\n  when: unknown\n  persona: x.\n  colour: red\n")
    with pytest.raises(KfbotError, match=rf"{bad}:\d+: persona odd-one\.colour: unknown key"):
        load_personas(bad)
    bad = _write(tmp_path, "- id: no-text\n  when: unknown\n")
    with pytest.raises(KfbotError, match=rf"{bad}:\d+: persona no-text: missing required key "
                                         "'persona'"):
        load_personas(bad)
    bad = _write(tmp_path, "- id: wrong-when\n  when: slow\n  persona: x.\n")
    with pytest.raises(KfbotError, match=r"persona wrong-when\.when: unknown value 'slow' "
                                         r"\(expected one of: memory-bound, "):
        load_personas(bad)
    bad = _write(tmp_path, "- id: p-unknown\n  when: unknown\n  persona: x.\n")
    with pytest.raises(KfbotError, match="persona p-unknown: the id is used twice"):
        load_personas(bad)
    path = tmp_path / "few.yaml"
    path.write_text("- id: only\n  when: unknown\n  persona: x.\n", encoding="utf-8")
    with pytest.raises(KfbotError, match="no persona for memory-bound"):
        load_personas(path)


# ---------------------------------------------------------------------------- meta prompts

def test_mutate_meta_prompt_is_deterministic_and_small() -> None:
    meta = "\n".join(META_HINTS[:2])
    runs = [[mutate_meta_prompt(meta, rng) for _ in range(3)]
            for rng in (random.Random(5), random.Random(5))]
    assert runs[0] == runs[1]
    other = [mutate_meta_prompt(meta, random.Random(seed)) for seed in range(20)]
    assert len(set(other)) > 1
    for result in other:
        old, new = set(meta.splitlines()), set(result.splitlines())
        assert len(old ^ new) in (1, 2)  # one line added, dropped or swapped
        assert new <= set(META_HINTS)
    assert mutate_meta_prompt("", random.Random(1)) in META_HINTS
    assert meta == "\n".join(META_HINTS[:2])  # the input is left alone


@pytest.mark.parametrize("head", ["k.cu", "### k.cu", "File: k.cu", "**k.cu**", "`./k.cu`"])
def test_path_line_forms(head: str) -> None:
    assert parse_edits(f"{head}\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n") == \
        [Edit("k.cu", "a\n", "b\n")]
