"""The mutators together: what an island proposes from a parent.

Each island asks the mutators in its own rotating order (params, rules, llm), so the
islands explore differently from the same start; a mutator with nothing new to offer
is skipped. What the evaluations said feeds the LLM mutator's next prompt on that
island: the parent's diagnosis (which picks the expert persona) and its compiler and
verification lines, its per-shape speedups and how close each shape is to the GPU's
measured peak, the rewrites of the library that failed on this kernel and why, the
island's recent failures, and the lessons from earlier runs. Each island keeps
strategy hints (its meta-prompt): a hint set that led to an improving child is kept,
one that did not is mutated.

A rewrite whose output did not compile is dropped for the rest of the run: it would
fail the same way on every descendant. Its compiler message is kept for the report.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.task import KernelTask
from kfbot.search.evolution.archive import Individual
from kfbot.search.mutators.flags import FlagSpace, propose_flags
from kfbot.search.mutators.llm import META_HINTS, LlmMutator, PromptContext, mutate_meta_prompt
from kfbot.search.mutators.params import Knob, apply_point, propose_points
from kfbot.search.outcome.pershape import light_lines, prompt_lines, rows_of
from kfbot.search.rewrites import (
    Expert,
    Rewrite,
    cuda_text,
    load_library,
    locate,
    propose_rewrites,
    recognise,
    worked_examples,
)
from kfbot.text import read_source

# Compiler flags come third on every island: after the first two, before the others.
ORDERS = (("params", "rules", "flags", "llm"), ("rules", "llm", "flags", "params"),
          ("llm", "params", "flags", "rules"))
RECENT_FAILURES = 6
# Turns the LLM skips after API errors in a row: 2, 4, 8... at most this many. An
# island whose parent has nothing new asks other parents in the same generation, so a
# rate-limited API would otherwise be called once for each of them.
MAX_LLM_PAUSE = 16


@dataclass
class Mutators:
    task: KernelTask
    knobs: Sequence[Knob]
    rewrites: Sequence[Rewrite]
    llm: LlmMutator | None = None
    task_text: str = ""
    batch: int = 2
    candidates: dict[str, Candidate] = field(default_factory=dict)
    failures: dict[int, list[str]] = field(default_factory=dict)
    lessons: Sequence[str] = ()  # from the experience file, most relevant first
    meta: dict[int, str] = field(default_factory=dict)  # island -> strategy hints
    findings: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # Per candidate: its per-shape speedups and its distance to the measured peaks.
    shapes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rule_failures: dict[str, str] = field(default_factory=dict)  # rule id -> why it failed
    dropped: dict[str, str] = field(default_factory=dict)  # rule id -> its compiler message
    llm_improvements: int = 0  # LLM children faster than their parent
    flags: FlagSpace | None = None  # the compiler settings the build can carry
    _points: set[tuple[str, ...]] = field(default_factory=set)
    _given: set[str] = field(default_factory=set)  # hashes of every candidate proposed
    _tried: set[str] = field(default_factory=set)  # rationales of every candidate proposed
    _llm_errors: int = 0  # API errors in a row (after the client's own retries)
    _llm_pause: int = 0  # LLM turns still to skip after them
    _examples: tuple[str, ...] | None = None

    def base_files(self) -> dict[str, str]:
        """The editable files as they are in the repository."""
        out = {}
        for rel in self.task.editable_files:
            path = self.task.root / rel
            if path.is_file():
                out[rel] = read_source(path, rel)  # byte-exact: what a branch commits
        return out

    def candidate(self, individual: Individual) -> Candidate:
        return self.candidates.get(individual.hash, ORIGINAL)

    def propose(self, island: int, parent: Individual, rng: random.Random) -> list[Candidate]:
        """Up to `batch` candidates no island was given before: one from each mutator in
        the island's order first, then more from the same ones. A mutator with many
        proposals (the rules, on a kernel many rewrites fit) does not crowd out the
        others, and one whose proposals were all given already passes its turn."""
        cand = self.candidate(parent)
        files = {**self.base_files(), **cand.files}
        out: list[Candidate] = []
        fresh: dict[str, list[Candidate]] = {}
        for take in (1, self.batch):
            for name in ORDERS[island % len(ORDERS)]:
                if len(out) >= self.batch:
                    break
                if name not in fresh:  # each mutator asked once: an LLM call costs
                    fresh[name] = [c for c in self._one(name, island, cand, files, rng)
                                   if c.hash not in self._given]
                mine = fresh[name]
                for _ in range(min(take, self.batch - len(out), len(mine))):
                    chosen = mine.pop(0)
                    if chosen.hash not in self._given:
                        self._given.add(chosen.hash)
                        self._tried.add(chosen.rationale)
                        out.append(chosen)
        for c in out:
            self.candidates.setdefault(c.hash, c)
        return out

    def _one(self, name: str, island: int, parent: Candidate, files: Mapping[str, str],
             rng: random.Random) -> list[Candidate]:
        if name == "params":
            points = propose_points(self.knobs, parent, files, rng, self._points, 1)
            made = [apply_point(self.knobs, p, files, parent) for p in points]
            return [c for c in made if c is not None]
        if name == "rules":
            return self._rules(parent, files, rng)
        if name == "flags":  # settings not tried yet first: the neighbourhood is swept
            found = propose_flags(self.flags, parent, files, rng) if self.flags else []
            return sorted(found, key=lambda c: c.rationale in self._tried)
        if self.llm is None:
            return []
        if self._llm_pause > 0:  # after API errors: the other mutators take the turns
            self._llm_pause -= 1
            return []
        proposal = self.llm.propose(self._context(island, parent, files), parent)
        failed_call = (proposal.rejected or "").startswith("llm error:")
        self._llm_errors = self._llm_errors + 1 if failed_call else 0
        self._llm_pause = min(2 ** self._llm_errors, MAX_LLM_PAUSE) if failed_call else 0
        if proposal.candidate is None:
            self.note_failure(island, proposal.rejected or "the edit did not apply")
            return []
        return [proposal.candidate]

    def _rules(self, parent: Candidate, files: Mapping[str, str], rng: random.Random
               ) -> list[Candidate]:
        """The structural rewrites of the kernel's class first, in the library's order
        (they change the most), then the small ones shuffled; each island keeps those it
        has not seen, up to its batch, so the islands share out the structural ones."""
        experts = {r.id for r in self.rewrites if isinstance(r, Expert)}
        proposed = propose_rewrites(files, self.task.editable_files, parent,
                                    self.task.kernel_name, self.rewrites, self._rtol())
        first: list[Candidate] = []
        rest: list[Candidate] = []
        for cand in proposed:
            rule = rule_id(cand)
            if rule not in self.dropped:
                (first if rule in experts else rest).append(cand)
        rng.shuffle(rest)
        return first + rest

    def _rtol(self) -> float | None:
        declared = self.task.tolerances.get("float32")
        return declared[1] if declared is not None else None

    def _context(self, island: int, parent: Candidate, files: Mapping[str, str]
                 ) -> PromptContext:
        diagnosis, lines = self.findings.get(parent.hash, ("unknown", ()))
        meta = self.meta.setdefault(island, META_HINTS[island % len(META_HINTS)])
        return PromptContext(task=self.task_text, diagnosis=diagnosis, parent_files=dict(files),
                             diagnostics=lines, failures=tuple(self.failures.get(island, ())),
                             lessons=tuple(self.lessons), meta_prompt=meta,
                             editable=self.task.editable_files, examples=self.examples(),
                             shapes=self.shapes.get(parent.hash, ()),
                             failed_rewrites=self.failed_rewrite_lines())

    def failed_rewrite_lines(self) -> tuple[str, ...]:
        """The library's rewrites that failed on this kernel, and why, one line each."""
        return tuple(f"{rule}: {why}" for rule, why in sorted(self.rule_failures.items()))

    def examples(self) -> tuple[str, ...]:
        """The expert library's worked examples for the classes the original kernel
        belongs to (confidently or likely), read once per search."""
        if self._examples is None:
            files = self.base_files()
            home, target = locate(files, [p for p in self.task.editable_files if p in files],
                                  self.task.kernel_name)
            code = cuda_text(home, files[home]) if home is not None else None
            library = load_library()
            found = recognise(code, target, library) if code is not None else []
            self._examples = worked_examples(library, [r.kernel_class for r in found])
        return self._examples

    def note_result(self, island: int, cand: Candidate, ev: Evaluation,
                    improved: bool, rng: random.Random) -> None:
        """What an evaluation teaches the island's next proposals."""
        if not ev.ok:
            self.note_failure(island, f"{ev.stage}: {ev.reason}")
        self.findings[cand.hash] = (diagnosis_of(ev), _lines_of(ev))
        self.shapes[cand.hash] = (*prompt_lines(rows_of(ev.timings)),
                                  *light_lines(ev.timings))
        if cand.origin == "rules" and rule_id(cand):
            self._note_rule(cand, ev)
        if cand.origin == "llm" and improved:
            self.llm_improvements += 1
        if cand.origin == "llm":  # the hints steered this child: keep them or move on
            current = self.meta.setdefault(island, META_HINTS[island % len(META_HINTS)])
            if not improved:
                self.meta[island] = mutate_meta_prompt(current, rng)

    def _note_rule(self, cand: Candidate, ev: Evaluation) -> None:
        """A rewrite that failed or made the kernel slower, for the LLM; one whose output
        did not compile, dropped."""
        rule = rule_id(cand)
        if ev.stage == "build":
            message = compiler_message(ev)
            self.dropped.setdefault(rule, message)
            self.rule_failures.setdefault(rule, f"its output does not compile: {message}")
        elif not ev.ok:
            self.rule_failures.setdefault(rule, f"{ev.stage}: {ev.reason}"[:300])
        elif ev.verdict == "slower":
            self.rule_failures.setdefault(rule, f"correct but slower ({ev.speedup or 0:.2f}x)")

    def note_failure(self, island: int, reason: str) -> None:
        recent = self.failures.setdefault(island, [])
        recent.append(reason[:300])
        del recent[:-RECENT_FAILURES]


def diagnosis_of(ev: Evaluation) -> str:
    """The bound most benchmark shapes showed (memory-, compute-, latency-bound...), or
    `unknown` without timings: it picks the LLM's expert persona."""
    bounds = [t.bound for t in ev.timings if t.bound]
    if not bounds:
        return "unknown"
    return max(sorted(set(bounds)), key=bounds.count)


def _lines_of(ev: Evaluation, limit: int = 8) -> tuple[str, ...]:
    """Compiler and verification lines worth showing the LLM: errors and resources first."""
    # How the build was made (fast path or whole) says nothing about the kernel.
    lines = [f"{d.stage}/{d.kind}: {d.message}" for d in ev.diagnostics
             if d.kind != "build_path"]
    lines += [f"{c.input} vs {c.against}: {c.error or c.description}"
              for c in ev.checks if not c.passed]
    return tuple(line[:300] for line in lines[:limit])


def rule_id(cand: Candidate) -> str:
    """The id of the rewrite that made a rules candidate (its rationale's first word)."""
    return cand.rationale.split(":", 1)[0]


def compiler_message(ev: Evaluation) -> str:
    """The first compiler error of a failed build, with its place, on one line."""
    for d in ev.diagnostics:
        if d.severity == "error" and d.stage == "build":
            where = f"{d.file}:{d.line}: " if d.file and d.line else ""
            return f"{where}{d.message}"[:300]
    return ev.reason[:300]
