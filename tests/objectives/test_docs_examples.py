"""The objective examples of README.md and docs/objectives.md run as written and keep the contract."""

from pathlib import Path

import pytest
import torch

from klear.objectives import OBJECTIVES, Max, Objective, PolicyObjective, Ratio, get_objective
from tests.objectives.contract import (
    check_contract,
    check_forward_linear,
    check_surrogate_linear,
    check_token_gradient_scales,
)

ROOT = Path(__file__).parents[2]


def snippet(path: str, heading: str) -> str:
    """The first ```python block after ``heading`` in ``path``."""
    text = (ROOT / path).read_text()
    section = text[text.index(heading) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```\n", start)]


@pytest.fixture
def scratch_registry(monkeypatch):
    """Examples register names of their own: keep them out of the registry the other tests see."""
    monkeypatch.setattr(OBJECTIVES, "_entries", dict(OBJECTIVES._entries))


@pytest.mark.parametrize(
    ("path", "heading", "names"),
    [
        ("README.md", "### Add an objective", {"soft-clip": PolicyObjective}),
        ("docs/objectives.md", "## Adding a scheme", {"soft-clip": PolicyObjective, "gpg": Objective}),
        ("docs/objectives.md", "### A diagnostic of its own", {"ppo-tails": PolicyObjective}),
    ],
)
def test_example_runs_and_keeps_the_contract(path, heading, names, scratch_registry, padded_batch):
    exec(compile(snippet(path, heading), path, "exec"), {"__name__": "docs_example"})
    for name, base in names.items():
        objective = get_objective(name)
        assert isinstance(objective, base)
        check_contract(objective, padded_batch)
        check_surrogate_linear(objective)
        check_forward_linear(objective, padded_batch)
        check_token_gradient_scales(objective, padded_batch)
    for name in [name for name, base in names.items() if base is Objective]:
        with pytest.raises(ValueError, match=f"objective '{name}' has no hyperparameter 'eps_low'"):
            get_objective(name, eps_low=0.1)


def test_the_diagnostic_example_declares_its_reductions(scratch_registry):
    path = "docs/objectives.md"
    exec(compile(snippet(path, "### A diagnostic of its own"), path, "exec"), {"__name__": "docs_example"})
    # Ratios 3 and 1.5 with A > 0, 0.5 with A < 0: the largest positive ratio is 3, one of two positives is past 2.
    ratio = torch.tensor([[3.0, 1.5, 0.5]])
    metrics = get_objective("ppo-tails")(
        ratio.log(), torch.zeros(1, 3), torch.tensor([[1.0, 1.0, -1.0]]), torch.ones(1, 3)
    ).metrics
    assert isinstance(metrics["ratio_max_pos"], Max) and isinstance(metrics["far_pos_share"], Ratio)
    assert (float(metrics["ratio_max_pos"]), float(metrics["far_pos_share"])) == pytest.approx((3.0, 0.5))
