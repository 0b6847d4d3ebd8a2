"""The RL stage's batches reach ``training_step`` as they were drawn, under every precision Lightning offers."""

import pytest
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision

from klear.data.batches import HeldBatch, ResumableBatches
from klear.data.problems import Problem


@pytest.mark.parametrize("precision", [Precision(), MixedPrecision("bf16-mixed", "cpu"), HalfPrecision("bf16-true")])
def test_a_held_batch_of_frozen_problems_passes_every_precision_as_it_is(precision):
    problems = [Problem(prompt=f"Start with {n}.", reference=str(n)) for n in range(6)]
    batches = ResumableBatches(problems, batch_size=4, num_batches=2, seed=3, collate=HeldBatch)
    drawn = next(iter(batches))
    # bf16-true converts the floating tensors of each batch, rebuilding every dataclass it walks into: frozen
    # problems cannot be rebuilt (and a list of them would be copied at every step)
    converted = precision.convert_input(drawn)
    assert converted is drawn and converted.items == batches.batch_at(0)
    assert all(problem in problems for problem in converted.items)
