"""StepMetrics: sums and maxima over the parts of a step, reduced across ranks with one call per kind."""

import pytest
import torch

from klear.runtime.step_metrics import StepMetrics


def test_sums_and_maxima_combine_over_parts():
    metrics = StepMetrics()
    for part in (torch.tensor(0.25), torch.tensor(0.5)):
        metrics.add("objective/clip_frac_low", part * 0.5)  # token mean weighted by the part's share of tokens
        metrics.add("objective/ratio_max", part + 1.0, "max")
    assert metrics.reduce() == {"objective/clip_frac_low": 0.375, "objective/ratio_max": 1.5}


def test_one_reduction_per_kind_with_every_metric_stacked():
    metrics = StepMetrics()
    metrics.add("a", torch.tensor(1.0))
    metrics.add("b", torch.tensor(2.0))
    metrics.add("m", torch.tensor(3.0), "max")
    calls = []

    def reduce(tensor, op):  # two ranks holding the same values
        calls.append((op, tensor.shape))
        return tensor * 2 if op == "sum" else tensor

    assert metrics.reduce(reduce) == {"a": 2.0, "b": 4.0, "m": 3.0}
    assert calls == [("sum", torch.Size([2])), ("max", torch.Size([1]))]


def test_means_over_updates_keep_maxima_and_a_key_keeps_its_kind():
    step = StepMetrics()
    kinds = {"objective/ratio_max": "max"}
    step.add_result({"actor/pg_loss": 1.0, "objective/ratio_max": 1.2}, kinds)
    step.add_result({"actor/pg_loss": 3.0, "objective/ratio_max": 1.1}, kinds)
    assert step.mean(2) == {"actor/pg_loss": 2.0, "objective/ratio_max": 1.2}
    with pytest.raises(ValueError, match="metric 'actor/pg_loss' is a sum, not a max"):
        step.add("actor/pg_loss", 1.0, "max")
