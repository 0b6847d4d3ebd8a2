"""StepMetrics: token means weighted by tokens, sums, maxima and ratios over the parts of a step, reduced across
ranks with one call per kind, averaged over updates, ratios divided only once their sums are complete."""

import pytest
import torch

from klear.runtime.step_metrics import Max, Ratio, StepMetrics, Sum


def part(mean: float, total: float, peak: float, numerator: float, denominator: float) -> dict:
    """One micro-batch's metrics, as an objective declares them."""
    return {
        "mean": torch.tensor(mean),
        "sum": Sum(torch.tensor(total)),
        "max": Max(torch.tensor(peak)),
        "share": Ratio(torch.tensor(numerator), torch.tensor(denominator)),
    }


def two_ranks(one: StepMetrics, two: StepMetrics, calls: list):
    """``one`` reduced with ``two`` as the other rank: a reduce function that adds (or maxes) the two stacks."""
    other = {}
    two.reduce(lambda tensor, reduce_op: other.setdefault(reduce_op, tensor))

    def reduce(tensor, reduce_op):
        calls.append((reduce_op, tensor.shape))
        return tensor + other[reduce_op] if reduce_op == "sum" else torch.maximum(tensor, other[reduce_op])

    return one.reduce(reduce)


def test_each_kind_combines_over_the_parts_of_an_update():
    metrics = StepMetrics()
    # Parts of 1 and 3 tokens (weights 0.25 and 0.75): the token mean over the update is 0.25*0.2 + 0.75*0.6.
    metrics.add_metrics(part(0.2, 1.0, 1.5, 1.0, 1.0), weight=torch.tensor(0.25), prefix="objective/")
    metrics.add_metrics(part(0.6, 2.0, 1.25, 0.0, 3.0), weight=torch.tensor(0.75), prefix="objective/")
    result = metrics.reduce()
    assert result == pytest.approx(
        {"objective/mean": 0.5, "objective/sum": 3.0, "objective/max": 1.5, "objective/share": 0.25}
    )
    assert result.maxima == {"objective/max"} and result.ratios == {"objective/share": (1.0, 4.0)}


def test_two_ranks_reduce_in_one_call_per_kind():
    one, two = StepMetrics(), StepMetrics()
    one.add_metrics(part(0.2, 1.0, 1.5, 1.0, 2.0), weight=0.5)  # each rank holds half of the update's tokens
    two.add_metrics(part(0.4, 3.0, 2.5, 3.0, 2.0), weight=0.5)
    calls = []
    result = two_ranks(one, two, calls)
    assert result == pytest.approx({"mean": 0.3, "sum": 4.0, "max": 2.5, "share": 1.0})  # share (1 + 3) / (2 + 2)
    # The sums, the ratio parts and the means in one stacked tensor; the maxima in another.
    assert calls == [("sum", torch.Size([4])), ("max", torch.Size([1]))]


def test_a_ratio_with_a_zero_denominator_is_left_out_and_its_parts_still_count():
    first, second = StepMetrics(), StepMetrics()
    first.add_ratio("actor/entropy_neg", torch.tensor(0.0), torch.tensor(0.0))  # no negative samples
    first.add("actor/pg_loss", torch.tensor(1.0))
    second.add_ratio("actor/entropy_neg", torch.tensor(3.0), torch.tensor(2.0))
    second.add("actor/pg_loss", torch.tensor(2.0))
    one = first.reduce()
    assert one == {"actor/pg_loss": 1.0}
    step = StepMetrics()
    step.add_result(one)
    assert step.mean(1) == {"actor/pg_loss": 1.0}
    step.add_result(second.reduce())
    assert step.mean(2) == {"actor/pg_loss": 1.5, "actor/entropy_neg": 1.5}


def test_a_step_averages_its_updates_keeps_maxima_and_divides_the_ratio_totals():
    step = StepMetrics()
    for mean, peak, numerator, denominator in ((1.0, 1.2, 1.0, 1.0), (3.0, 1.1, 1.0, 3.0)):
        update = StepMetrics()
        update.add_metrics(
            {"mean": torch.tensor(mean), "max": Max(peak), "share": Ratio(numerator, denominator)}, weight=1.0
        )
        result = update.reduce()
        result["actor/grad_norm"] = 2 * mean  # set after the reduction: averaged like a mean
        step.add_result(result)
    # The ratio is (1 + 1) / (1 + 3), not the mean of 1.0 and 1/3.
    assert step.mean(2) == pytest.approx({"mean": 2.0, "max": 1.2, "share": 0.5, "actor/grad_norm": 4.0})


def test_a_key_keeps_its_kind_and_values_read_as_floats():
    metrics = StepMetrics()
    metrics.add("actor/pg_loss", 1.0)
    with pytest.raises(ValueError, match="metric 'actor/pg_loss' is a sum, not a max"):
        metrics.add("actor/pg_loss", 1.0, "max")
    with pytest.raises(ValueError, match="metric 'actor/pg_loss' is a sum, not a ratio"):
        metrics.add_ratio("actor/pg_loss", 1.0, 2.0)
    assert (float(Sum(torch.tensor(2.0))), float(Max(3.0)), float(Ratio(torch.tensor(1.0), 4.0))) == (2.0, 3.0, 0.25)
