"""The LLM mutator: asks Claude for SEARCH/REPLACE edits of a parent candidate.

    mutator = LlmMutator.from_env(LlmSettings(), budget)   # None without ANTHROPIC_API_KEY
    proposal = mutator.propose(PromptContext(...), parent)
    proposal.candidate   # a Candidate with the edits applied, or None
    proposal.rejected    # why not, in one line: fed back to the next prompt as a failure

The request has a stable system prefix (role, edit format, the expert persona chosen by
the parent's diagnosis) marked for prompt caching, and a user message with everything
that changes per call (task, files, diagnostics, failures, lessons, strategy hints).
Tokens and money are charged to the run's budget from the usage the API reports. API
errors that remain after the SDK's own retries become a rejection, never an exception,
so a flaky network cannot stop the search.
"""

from __future__ import annotations

import importlib.util
import random
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from kfbot import extras
from kfbot.datafiles import Id, Text, load_entries, rules_dir
from kfbot.errors import KfbotError
from kfbot.evaluate.candidate import Candidate
from kfbot.evaluate.sandbox import credentials
from kfbot.search.budget import Budget
from kfbot.search.edits import FORMAT_HELP, EditError, apply_edits, parse_edits

# anthropic takes seconds to import: only a mutator that will call it imports it.
if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message, MessageParam, TextBlockParam

Diagnosis = Literal["memory-bound", "compute-bound", "latency-bound", "reduction-heavy",
                    "under-utilised", "unknown"]
DIAGNOSES: tuple[str, ...] = get_args(Diagnosis)
PERSONAS_FILE = "personas.yaml"
NO_KEY_NOTICE = ("llm mutator off: ANTHROPIC_API_KEY is not set; "
                 "params and rules mutators still run")
NO_SDK_NOTICE = ("llm mutator off: the anthropic package is not installed "
                 f"({extras.install_line('llm')}); params and rules mutators still run")
RATIONALE_CHARS = 300
# Prompt-caching prices relative to the base input price (Anthropic's published ratios).
CACHE_WRITE_FACTOR = 1.25
CACHE_READ_FACTOR = 0.1



# ---------------------------------------------------------------------------- personas

@dataclass(frozen=True)
class Persona:
    id: Id
    when: Diagnosis
    persona: Text  # prose; folded to one line when loaded


def load_personas(path: Path | None = None) -> dict[str, Persona]:
    """The personas in `path` (default: the shipped personas.yaml), by id, in file order."""
    if path is None:
        return dict(_default_personas())
    return _load_personas(path)


@cache
def _default_personas() -> tuple[tuple[str, Persona], ...]:
    return tuple(_load_personas(rules_dir() / PERSONAS_FILE).items())


def persona_for(diagnosis: str, personas: Mapping[str, Persona] | None = None) -> Persona:
    """The first persona for `diagnosis`; the `unknown` one for a diagnosis without any."""
    table = load_personas() if personas is None else personas
    for want in (diagnosis, "unknown"):
        for persona in table.values():
            if persona.when == want:
                return persona
    raise KfbotError(f"no persona for diagnosis {diagnosis!r} and none for 'unknown'")


def _load_personas(path: Path) -> dict[str, Persona]:
    personas = {p.id: replace(p, persona=" ".join(p.persona.split()))
                for p in load_entries(path, Persona, "persona")}
    missing = [d for d in DIAGNOSES if not any(p.when == d for p in personas.values())]
    if missing:
        raise KfbotError(f"{path}: no persona for {', '.join(missing)} "
                         "(every diagnosis needs at least one)")
    return personas


# ---------------------------------------------------------------------------- the mutator

@dataclass(frozen=True)
class LlmSettings:
    model: str = "claude-sonnet-5-5"  # configurable; 4-5 reaches end of life 2026-11-30
    max_tokens: int = 8000
    timeout_s: float = 120.0
    max_retries: int = 3
    # Kept for configuration files, but not sent: API version 2026-10-21 (the one the
    # anthropic 2.x SDK sends) rejects temperature/top_p/top_k with HTTP 400.
    temperature: float = 0.7
    usd_per_mtok_in: float = 3.0
    usd_per_mtok_out: float = 15.0
    base_url: str | None = None


@dataclass(frozen=True)
class PromptContext:
    task: str  # op name, shapes, dtypes, reference expression: one paragraph
    diagnosis: str  # one of DIAGNOSES; picks the persona
    parent_files: Mapping[str, str]  # editable files of the parent, full text
    diagnostics: Sequence[str] = ()  # ptxas / verification lines
    failures: Sequence[str] = ()  # recent failures on the island, one line each
    lessons: Sequence[str] = ()  # relevant lessons from earlier runs
    meta_prompt: str = ""  # the island's strategy hints
    editable: Sequence[str] = ()
    # Worked examples of the expert library for the kernel's class (Markdown); the
    # same for every call of a task, so they sit in the cached system prefix.
    examples: Sequence[str] = ()
    # The parent's speedup per shape, captured and held out, and how close each shape is
    # to the GPU's measured peak (its speed of light).
    shapes: Sequence[str] = ()
    # The library's rewrites that failed on this kernel, each with why.
    failed_rewrites: Sequence[str] = ()


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    usd: float = 0.0

    @property
    def tokens(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_creation_input_tokens
                + self.cache_read_input_tokens)


@dataclass
class LlmStats:
    """What the mutator spent over a run: calls, what they cost, and the errors left
    after the SDK's own retries, by kind (RateLimitError, APITimeoutError...)."""

    calls: int = 0
    answered: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    usd: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    unusable: int = 0  # answered, but with no edit that applied

    @property
    def tokens(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_creation_input_tokens
                + self.cache_read_input_tokens)

    def add(self, usage: Usage) -> None:
        self.answered += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cache_creation_input_tokens += usage.cache_creation_input_tokens
        self.cache_read_input_tokens += usage.cache_read_input_tokens
        self.usd += usage.usd


@dataclass(frozen=True)
class LlmProposal:
    candidate: Candidate | None
    rejected: str | None
    usage: Usage = field(default_factory=Usage)


class LlmMutator:
    def __init__(self, settings: LlmSettings, budget: Budget, api_key: str | None = None,
                 client: anthropic.Anthropic | None = None) -> None:
        import anthropic

        self.settings = settings
        self.budget = budget
        self.stats = LlmStats()
        self.api_error = anthropic.APIError
        self.client = client if client is not None else anthropic.Anthropic(
            api_key=api_key, base_url=settings.base_url, max_retries=settings.max_retries,
            timeout=settings.timeout_s)

    @classmethod
    def from_env(cls, settings: LlmSettings, budget: Budget,
                 key: str | None = None) -> LlmMutator | None:
        """A mutator using `key`, else ANTHROPIC_API_KEY as kfbot was started with; None
        (after one notice on stderr) without either, or without the anthropic package."""
        key = (key or credentials.original("ANTHROPIC_API_KEY") or "").strip()
        off = off_because(key)
        if off is not None:
            print(off, file=sys.stderr)
            return None
        return cls(settings, budget, api_key=key)

    def propose(self, ctx: PromptContext, parent: Candidate) -> LlmProposal:
        spent = self.budget.exhausted()
        if spent is not None:
            return LlmProposal(None, f"llm skipped: {spent}")
        s = self.settings
        system: list[TextBlockParam] = [{"type": "text",
                                         "text": system_prompt(ctx.diagnosis, ctx.examples),
                                         "cache_control": {"type": "ephemeral"}}]
        messages: list[MessageParam] = [{"role": "user", "content": user_prompt(ctx)}]
        self.stats.calls += 1
        try:
            # No temperature: the API version the 2.x SDK speaks (2026-10-21) removed the
            # sampling parameters and answers 400 to any of them (LlmSettings.temperature).
            message = self.client.messages.create(
                model=s.model, max_tokens=s.max_tokens, system=system, messages=messages)
        except self.api_error as e:
            kind = type(e).__name__
            self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
            return LlmProposal(None, f"llm error: {kind}: {_short_error(e)}")
        usage = self._charge(message)
        self.stats.add(usage)
        answer = "\n".join(block.text for block in message.content if block.type == "text")
        base = {**parent.files, **ctx.parent_files}
        try:
            changed = apply_edits(base, parse_edits(answer), ctx.editable)
        except EditError as e:
            self.stats.unusable += 1
            cut = "answer cut off at max_tokens; " if message.stop_reason == "max_tokens" else ""
            return LlmProposal(None, cut + e.reason, usage)
        candidate = Candidate(files={**parent.files, **changed}, params=parent.params,
                              origin="llm", parent=parent.hash, rationale=rationale(answer))
        return LlmProposal(candidate, None, usage)

    def _charge(self, message: Message) -> Usage:
        u, s = message.usage, self.settings
        usage = Usage(input_tokens=u.input_tokens or 0, output_tokens=u.output_tokens or 0,
                      cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
                      cache_read_input_tokens=u.cache_read_input_tokens or 0)
        usd = cost_usd(usage, s.usd_per_mtok_in, s.usd_per_mtok_out)
        usage = Usage(usage.input_tokens, usage.output_tokens,
                      usage.cache_creation_input_tokens, usage.cache_read_input_tokens, usd)
        self.budget.charge(tokens=usage.tokens, usd=usd)
        return usage


def off_because(key: str) -> str | None:
    """Why the LLM mutator cannot run with this key (blank: none given), or None."""
    if importlib.util.find_spec("anthropic") is None:
        return NO_SDK_NOTICE
    return None if key.strip() else NO_KEY_NOTICE


def cost_usd(usage: Usage, usd_per_mtok_in: float, usd_per_mtok_out: float) -> float:
    """Dollars for a call: cache writes cost 1.25x and cache reads 0.1x the input price."""
    input_equivalent = (usage.input_tokens
                        + CACHE_WRITE_FACTOR * usage.cache_creation_input_tokens
                        + CACHE_READ_FACTOR * usage.cache_read_input_tokens)
    return (input_equivalent * usd_per_mtok_in + usage.output_tokens * usd_per_mtok_out) / 1e6


def _short_error(e: anthropic.APIError) -> str:
    message = e.message
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            message = f"{inner.get('type', 'error')}: {inner['message']}"
    status = getattr(e, "status_code", None)  # an APIStatusError: the server answered
    if status is not None:
        message = f"HTTP {status} {message}"
    text = " ".join(str(message).split())
    return text if len(text) <= 200 else text[:199] + "…"


# ---------------------------------------------------------------------------- prompts

def system_prompt(diagnosis: str, examples: Sequence[str] = ()) -> str:
    """The stable, cached prefix: role, edit format, the diagnosis' persona and the
    worked examples for the kernel's class."""
    persona = persona_for(diagnosis)
    worked = ("## Worked examples for kernels of this kind\n"
              "Each shows a naive kernel and a faster one that gives the same results; "
              "apply the idea that fits the kernel you are given, keeping its signature "
              "contract with its launcher (or changing the launcher with it).\n\n"
              + "\n\n".join(examples) + "\n\n") if examples else ""
    return (
        "You optimise CUDA kernels for speed without changing their results. You are given "
        "an operation, the kernel source files you may edit, and what is known about the "
        "current version's performance. Propose one focused improvement.\n\n"
        f"{persona.persona}\n\n"
        "Rules: keep the kernel's inputs, outputs and numerical results (within the "
        "verification tolerance); do not special-case the test inputs, skip work, cache "
        "results between calls or call vendor libraries; edit only the editable files.\n\n"
        "Start your answer with one short paragraph saying what you change and why it "
        "should be faster, then give the edits.\n\n"
        f"{worked}{FORMAT_HELP}\n")


def user_prompt(ctx: PromptContext) -> str:
    """Everything that changes from call to call."""
    parts = [f"## Task\n{ctx.task.strip()}", f"## Diagnosis\n{ctx.diagnosis}"]
    editable = ", ".join(ctx.editable) or "none"
    files = [f"### {path}\n```cuda\n{text.rstrip()}\n```"
             for path, text in sorted(ctx.parent_files.items())]
    parts.append(f"## Editable files ({editable})\n" + "\n\n".join(files))
    for title, lines in (("Diagnostics (ptxas / verification)", ctx.diagnostics),
                         ("Per shape: speedup over the original and distance to the GPU's "
                          "peak", ctx.shapes),
                         ("Rewrites already tried on this kernel that failed", ctx.failed_rewrites),
                         ("Recent failures on this island: do not repeat them", ctx.failures),
                         ("Lessons from earlier runs", ctx.lessons)):
        if lines:
            parts.append(f"## {title}\n" + "\n".join(f"- {line.strip()}" for line in lines))
    if ctx.meta_prompt.strip():
        parts.append(f"## Strategy hints\n{ctx.meta_prompt.strip()}")
    parts.append("Answer with a short rationale paragraph, then SEARCH/REPLACE edit blocks.")
    return "\n\n".join(parts) + "\n"


def rationale(answer: str) -> str:
    """The answer's first paragraph of prose, on one line, at most 300 characters."""
    for paragraph in re.split(r"\n\s*\n", answer.strip()):
        text = paragraph.strip()
        if not text or text.startswith(("```", "<<<<<<<")) or "\n<<<<<<<" in text:
            break
        text = " ".join(text.split())
        return text if len(text) <= RATIONALE_CHARS else text[:RATIONALE_CHARS - 1] + "…"
    return ""


# ---------------------------------------------------------------------------- meta prompts

META_HINTS: tuple[str, ...] = (
    "Prefer changes to memory access patterns over arithmetic changes.",
    "Try vectorized 128-bit loads and stores where alignment allows.",
    "Increase the work done per thread before changing the block size.",
    "Keep intermediate values in registers; avoid extra global memory round trips.",
    "Use shared-memory tiling when data is reused across threads.",
    "Use warp-level primitives (__shfl_*_sync) instead of shared memory for reductions.",
    "Reduce the number of kernel launches by fusing consecutive steps.",
    "Unroll short fixed-trip loops and expose independent instructions.",
    "Tune the launch configuration so the grid covers every SM several times.",
    "Make small, safe edits: one idea per proposal.",
    "Try a bolder restructuring of the kernel's decomposition of work.",
    "Lower register pressure so more warps can be resident.",
)
MAX_META_LINES = 5


def mutate_meta_prompt(meta: str, rng: random.Random) -> str:
    """Add, drop or swap one hint line of an island's strategy hints (deterministic per rng)."""
    lines = [line.strip() for line in meta.splitlines() if line.strip()]
    absent = [hint for hint in META_HINTS if hint not in lines]
    moves: list[str] = []
    if absent and len(lines) < MAX_META_LINES:
        moves.append("add")
    if len(lines) > 1:
        moves.append("drop")
    if lines and absent:
        moves.append("swap")
    if not moves:
        return "\n".join(lines)
    move = rng.choice(moves)
    if move == "add":
        lines.append(rng.choice(absent))
    elif move == "drop":
        del lines[rng.randrange(len(lines))]
    else:
        lines[rng.randrange(len(lines))] = rng.choice(absent)
    return "\n".join(lines)
