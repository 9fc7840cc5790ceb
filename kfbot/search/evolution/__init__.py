"""The evolutionary strategy: what to try next.

    archive   a MAP-Elites archive: the best correct candidate per behaviour cell
    islands   several archives evolving apart, with ring migration
    features  the behaviour cell of a candidate, read off its source with tree-sitter

It may import the search's own values (`search.model`, `search.budget`), the
evaluation's records, the scan's tree-sitter helpers and the ground floor; no other
sub-package of the search. The strategy does not know what a mutator is: it is given
a `propose` and an `evaluate` callable.
"""
