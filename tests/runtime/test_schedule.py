"""The learning-rate schedule every stage steps once per step (`klear.runtime.optim.lr_factor`): linear warmup from
0, then cosine decay to ``min_lr`` over the rest of the run, or constant; the warmup in steps or as a share of the
run."""

import itertools
import math

import pytest

from klear.runtime.optim import lr_factor, share_of, warmup_steps
from klear.schema import OptimConfig


def test_warmup_then_cosine_to_the_floor():
    config = OptimConfig(lr=8e-5, min_lr=4e-5, warmup_steps=4)
    factors = [lr_factor(step, config, 20) for step in range(21)]
    assert factors[:5] == [1 / 5, 2 / 5, 3 / 5, 4 / 5, 1.0]  # step 4 is the first after the warmup: the peak
    assert factors[12] == pytest.approx(0.5 + 0.5 * 0.5 * (1 + math.cos(math.pi * 8 / 16)))  # half-way down
    assert factors[20] == pytest.approx(0.5)  # min_lr / lr at the last step, and after it
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))


def test_constant_after_warmup():
    config = OptimConfig(lr=1e-6, min_lr=1e-6, schedule="constant", warmup_steps=10)
    assert [lr_factor(step, config, 1000) for step in (0, 9, 10, 999)] == [1 / 11, 10 / 11, 1.0, 1.0]


@pytest.mark.parametrize(
    ("ratio", "total", "expected"), [(0.0, 500, 10), (0.1, 500, 50), (0.03, 870, 27), (0.07, 100, 7), (0.5, 3, 2)]
)
def test_warmup_ratio_is_a_share_of_the_run_rounded_up(ratio, total, expected):
    config = OptimConfig(warmup_steps=10, warmup_ratio=ratio)
    assert warmup_steps(config, total) == expected
    assert lr_factor(expected - 1, config, total) < 1.0 == lr_factor(expected, config, total)


def test_share_of_reads_the_decimal_as_written():
    assert 0.07 * 100 > 7 and share_of(0.07, 100) == 7  # floats: 7.000000000000001
    assert (share_of(1.5, 10), share_of(0.25, 10), share_of(2.0, 1)) == (15, 3, 2)
