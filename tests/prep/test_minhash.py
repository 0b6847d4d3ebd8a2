"""`klear.prep.minhash`: signatures estimate Jaccard similarity, the bands fit the threshold, the index proposes
near duplicates and not unrelated sets, and a signature is the same in every run."""

import numpy as np
import pytest

from klear.prep.minhash import PRIME, MinHashIndex, bands_and_rows


def proposed(threshold: float, similarity: float, num_perm: int = 128) -> float:
    bands, rows = bands_and_rows(threshold, num_perm)
    return 1.0 - (1.0 - similarity**rows) ** bands


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
def test_bands_fit_the_threshold(threshold):
    bands, rows = bands_and_rows(threshold, 128)
    assert bands * rows <= 128
    # The proposal curve is steep around the threshold: rare well below it, near certain well above it.
    assert proposed(threshold, threshold - 0.2) < 0.1
    assert proposed(threshold, min(threshold + 0.15, 1.0)) > 0.95


def test_bands_at_known_thresholds():
    # Hand-checked: 9 bands of 13 rows put the curve's steepest point at (1/9)^(1/13) = 0.845 for 0.8.
    assert bands_and_rows(0.8, 128) == (9, 13)
    assert bands_and_rows(0.5, 128) == (25, 5)
    assert bands_and_rows(1.0, 128) == (1, 128)  # only equal signatures


def sets(shared: int, own: int, tag: str) -> tuple[set[str], set[str]]:
    common = {f"gram {i}" for i in range(shared)}
    return common | {f"{tag} a {i}" for i in range(own)}, common | {f"{tag} b {i}" for i in range(own)}


def test_signatures_agree_as_often_as_the_sets_overlap():
    index = MinHashIndex(0.8, num_perm=512)
    a, b = sets(300, 100, "x")  # Jaccard 300 / 500 = 0.6
    agree = float(np.mean(index.signature(a) == index.signature(b)))
    assert abs(agree - 0.6) < 0.07  # three standard deviations of 512 draws
    assert np.array_equal(index.signature(a), index.signature(sorted(a)))  # order does not matter
    assert index.signature(a).max() < PRIME


def test_signature_is_the_same_in_every_run():
    # Stable hashes and a fixed seed: these values do not depend on PYTHONHASHSEED or on the process.
    signature = MinHashIndex(0.8, num_perm=4).signature({"what is 2 + 3", "is 2 + 3 ?"})
    assert signature.tolist() == EXPECTED_SIGNATURE
    assert np.array_equal(MinHashIndex(0.5, num_perm=4).signature({"is 2 + 3 ?", "what is 2 + 3"}), signature)


EXPECTED_SIGNATURE = [1253892609, 602236103, 1300949579, 344213331]
"""This implementation's values: a change of the hash or the seed shows here, and would change which pairs
``dedup --near minhash`` proposes."""


def test_index_proposes_near_duplicates_and_not_unrelated_sets():
    index = MinHashIndex(0.8)
    near, unrelated = 0, 0
    for pair in range(100):
        a, b = sets(380, 10, f"near {pair}")  # Jaccard 380 / 400 = 0.95
        c, d = sets(60, 70, f"far {pair}")  # Jaccard 60 / 200 = 0.3
        for key, elements in ((4 * pair, a), (4 * pair + 1, c)):
            index.add(key, index.signature(elements))
        near += 4 * pair in index.candidates(index.signature(b))
        unrelated += 4 * pair + 1 in index.candidates(index.signature(d))
    assert near >= 97  # proposed with probability 0.998 at 0.95 (9 bands of 13 rows)
    assert unrelated <= 1  # proposed with probability 1.4e-6 at 0.3
    same = {"only this"}
    index.add(1000, index.signature(same))
    assert 1000 in index.candidates(index.signature(same))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="num_perm must be >= 2"):
        MinHashIndex(0.8, num_perm=1)
    with pytest.raises(ValueError, match="at least one element"):
        MinHashIndex(0.8).signature(set())
