"""Normalised tokens and n-grams of problem texts, shared by decontamination and deduplication.

Two tokenisations, for two questions:
- `words` (letters and digits only, case-folded, Unicode NFKC) answers "does this training problem share a
  passage with a benchmark problem?". Punctuation, LaTeX markup spacing and case are noise there, and word
  n-grams are what the decontamination literature (and the paper's 9-gram rule) counts.
- `symbols` keeps every non-space symbol as a token of its own. It answers "is this the same problem?", where
  ``2+3`` and ``2-3`` must stay different problems, while spacing and case must not matter.

A text shorter than ``n`` tokens has no n-gram of length ``n``; `ngrams` gives it one shorter gram, the whole
text, so that two identical short texts still match (a short text inside a long one does not).

A set's template is what its rows repeat around their problems: an instruction (DAPO's layout opens every prompt
with the same one), a benchmark's stock phrase ("where m and n are relatively prime positive integers"). Its
n-grams cannot tell one problem from another, so `template_grams` finds them by how many distinct problems hold
each one, and `content_grams` leaves their words out.
"""

from __future__ import annotations

import math
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping

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


TEMPLATE_LEAST = 5
"""A gram is template only when at least this many distinct problems hold it: fewer cannot tell an instruction
from a problem a set asks twice."""
TEMPLATE_PROBE = 4000
"""Problems drawn (seeded, so a rerun finds the same) to pick the grams whose holders are then counted exactly, and
at least 100 / share of them, so that a gram held by a share s of the set is expected in 100 of the draw: the memory
stays that of a few thousand problems on a set of millions."""


def template_grams(texts: Iterable[str], n: int, share: float) -> dict[str, tuple[int, int]]:
    """The n-grams (of `words`) held by at least ``share`` of the distinct ``texts`` and by `TEMPLATE_LEAST` or
    more of them -> (how many hold it, how many distinct texts there are). Distinct texts, so a benchmark listed k
    times over (for avg@k) counts each problem once. ``share`` 0: none."""
    distinct = list(dict.fromkeys(" ".join(words(text)) for text in texts))
    if share <= 0 or len(distinct) < TEMPLATE_LEAST:
        return {}
    need = max(TEMPLATE_LEAST, math.ceil(share * len(distinct)))
    draw = max(TEMPLATE_PROBE, math.ceil(100 / share))
    probe = distinct if draw >= len(distinct) else random.Random(0).sample(distinct, draw)
    held = Counter(gram for text in probe for gram in set(ngrams(text.split(), n)))
    if len(probe) < len(distinct):  # the candidates, held by at least half the share in the draw, counted exactly
        candidates = {gram for gram, count in held.items() if count >= share / 2 * len(probe)}
        held = Counter(gram for text in distinct for gram in set(ngrams(text.split(), n)) if gram in candidates)
    return {gram: (count, len(distinct)) for gram, count in held.items() if count >= need}


def content_grams(tokens: list[str], n: int, template: Mapping[str, float]) -> list[str]:
    """The n-grams of ``tokens`` outside the words of the ``template`` grams they hold (gram -> the share of a set's
    problems that hold it): the text is cut where template grams cover it, and each piece gives its own n-grams,
    so no gram spans template words (DAPO's instruction followed by "Find the number of" would otherwise match every
    problem that starts so). A run of template grams is trimmed at each end to the grams held by at least half as
    many as its most held one: a problem's own last words before the instruction ("... add 2. Remember to put ...",
    held by the problems that end so) stay content. A piece shorter than n, between two template passages, gives no
    gram, unless it is all that is left of the text."""
    grams = ngrams(tokens, n)
    shares = [template.get(gram, 0.0) for gram in grams]
    if not any(shares):
        return grams
    covered = [False] * len(tokens)
    start = 0
    while start < len(grams):
        if not shares[start]:
            start += 1
            continue
        end = start
        while end + 1 < len(grams) and shares[end + 1]:
            end += 1
        first, last, peak = start, end, max(shares[start : end + 1])
        while shares[first] < peak / 2:
            first += 1
        while shares[last] < peak / 2:
            last -= 1
        covered[first : last + n] = [True] * len(covered[first : last + n])
        start = end + 1
    pieces: list[list[str]] = [[]]
    for token, is_template in zip(tokens, covered, strict=True):
        if not is_template:
            pieces[-1].append(token)
        elif pieces[-1]:
            pieces.append([])
    pieces = [piece for piece in pieces if piece]
    if len(pieces) == 1:
        return ngrams(pieces[0], n)
    return [gram for piece in pieces if len(piece) >= n for gram in ngrams(piece, n)]
