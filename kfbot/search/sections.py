"""Report sections for what a search learned besides its winner: the library's rewrites
dropped because their output did not compile, and what the LLM mutator cost for each
improvement it brought.

An improvement is an LLM child that was correct and faster than its parent when the
search evaluated it: what the tokens bought. A run where none was is said plainly,
with what it spent for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kfbot.search.mutators.llm import LlmStats
from kfbot.search.mutators.rotation import Mutators


def learned_from(mut: Mutators) -> tuple[dict[str, str], dict[str, Any] | None]:
    """What the mutators learned besides the winner: the rewrites dropped (with their
    compiler messages) and the LLM's spend per improvement."""
    return dict(mut.dropped), llm_spend(mut.llm.stats if mut.llm is not None else None,
                                        mut.llm_improvements)


def llm_spend(stats: LlmStats | None, improvements: int) -> dict[str, Any] | None:
    """report.json's `llm`: calls, tokens, dollars, errors, and per improvement."""
    if stats is None:
        return None
    per = improvements if improvements else None
    return {
        "calls": stats.calls, "answered": stats.answered, "unusable": stats.unusable,
        "errors": dict(sorted(stats.errors.items())),
        "input_tokens": stats.input_tokens, "output_tokens": stats.output_tokens,
        "cache_creation_input_tokens": stats.cache_creation_input_tokens,
        "cache_read_input_tokens": stats.cache_read_input_tokens,
        "tokens": stats.tokens, "usd": round(stats.usd, 6),
        "improvements": improvements,
        "tokens_per_improvement": round(stats.tokens / per) if per else None,
        "usd_per_improvement": round(stats.usd / per, 6) if per else None,
    }


def llm_markdown(spend: Mapping[str, Any] | None) -> list[str]:
    if spend is None:
        return []
    errors = ", ".join(f"{n} {kind}" for kind, n in spend["errors"].items())
    lines = ["## LLM mutator", "",
             f"{spend['calls']} calls, {spend['answered']} answered"
             + (f" ({spend['unusable']} without an edit that applied)" if spend["unusable"]
                else "")
             + (f"; failed after the client's retries: {errors}" if errors else "") + ".",
             f"{spend['tokens']} tokens ({spend['input_tokens']} in, {spend['output_tokens']} "
             f"out, {spend['cache_read_input_tokens']} read from the prompt cache), "
             f"${spend['usd']:.4f}.", ""]
    if spend["improvements"]:
        lines += [f"{spend['improvements']} accepted improvement(s) (an LLM candidate correct "
                  f"and faster than its parent): {spend['tokens_per_improvement']} tokens and "
                  f"${spend['usd_per_improvement']:.4f} per improvement.", ""]
    else:
        lines += [f"No LLM candidate was correct and faster than its parent: "
                  f"{spend['tokens']} tokens and ${spend['usd']:.4f} for no improvement.", ""]
    return lines


def dropped_markdown(dropped: Mapping[str, str]) -> list[str]:
    """The rewrites whose output did not compile, each with its compiler message."""
    if not dropped:
        return []
    return ["## Rewrites dropped", "",
            "Their pattern matched this kernel but their output did not compile; they were "
            "not proposed again in this run.", "",
            *[f"- `{rule}`: {message}" for rule, message in sorted(dropped.items())], ""]
