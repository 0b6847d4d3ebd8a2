"""Normalised tokens and n-grams of problem texts, shared by decontamination and deduplication.

Two tokenisations, for two questions:
- `words` (letters and digits only, case-folded, Unicode NFKC) answers "does this training problem share a
  passage with a benchmark problem?". Punctuation, LaTeX markup spacing and case are noise there, and word
  n-grams are what the decontamination literature (and the paper's 9-gram rule) counts.
- `symbols` keeps every non-space symbol as a token of its own. It answers "is this the same problem?", where
  ``2+3`` and ``2-3`` must stay different problems, while spacing and case must not matter.

A text shorter than ``n`` tokens has no n-gram of length ``n``; `ngrams` gives it one shorter gram, the whole
text, so that two identical short texts still match (a short text inside a long one does not).
"""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"\w+")
_SYMBOL = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """Case-folded NFKC word tokens (runs of letters, digits and underscores); punctuation is dropped."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def symbols(text: str) -> list[str]:
    """Case-folded NFKC tokens: runs of word characters, and every other non-space character on its own."""
    return _SYMBOL.findall(unicodedata.normalize("NFKC", text).casefold())


def normalise(text: str) -> str:
    """The text as `symbols` joined by single spaces: equal for texts that differ only in case and spacing."""
    return " ".join(symbols(text))


def ngrams(tokens: list[str], n: int) -> list[str]:
    """The n-grams of ``tokens`` in order, each as one space-joined string; ``[whole text]`` when shorter than n."""
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    if not tokens:
        return []
    if len(tokens) < n:
        return [" ".join(tokens)]
    return [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def jaccard(a: set[str], b: set[str]) -> float:
    """|a ∩ b| / |a ∪ b| (0.0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0
