"""The mutators together: what an island proposes from a parent.

Each island asks the mutators in its own rotating order (params, rules, llm), so the
islands explore differently from the same start; a mutator with nothing new to offer
is skipped. What the evaluations said feeds the LLM mutator's next prompt on that
island: the parent's diagnosis (which picks the expert persona) and its compiler and
verification lines, the island's recent failures, and the lessons from earlier runs.
Each island keeps strategy hints (its meta-prompt): a hint set that led to an improving
child is kept, one that did not is mutated.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.task import KernelTask
from kfbot.search.archive import Individual
from kfbot.search.llm import META_HINTS, LlmMutator, PromptContext, mutate_meta_prompt
from kfbot.search.params import Knob, apply_point, propose_points
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

ORDERS = (("params", "rules", "llm"), ("rules", "llm", "params"), ("llm", "params", "rules"))
RECENT_FAILURES = 6


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
    _points: set[tuple[str, ...]] = field(default_factory=set)
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
        cand = self.candidate(parent)
        files = {**self.base_files(), **cand.files}
        out: list[Candidate] = []
        for name in ORDERS[island % len(ORDERS)]:
            if len(out) >= self.batch:
                break
            out += self._one(name, island, cand, files, rng)
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
        if self.llm is None:
            return []
        proposal = self.llm.propose(self._context(island, parent, files), parent)
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
            (first if cand.rationale.split(":", 1)[0] in experts else rest).append(cand)
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
                             editable=self.task.editable_files, examples=self.examples())

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
        if cand.origin == "llm":  # the hints steered this child: keep them or move on
            current = self.meta.setdefault(island, META_HINTS[island % len(META_HINTS)])
            if not improved:
                self.meta[island] = mutate_meta_prompt(current, rng)

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
