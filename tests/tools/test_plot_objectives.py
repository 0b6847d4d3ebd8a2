"""tools/plot_objectives.py: measured weights match the gradient table, and the PNG includes user objectives."""

import pytest
import torch

import tests.objectives.test_user_objective  # noqa: F401  (registers "test-soft-clip")
from tests.tools import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("plot_objectives")


def test_weights_match_the_table(tool):
    ratios = torch.tensor([0.5, 1.0, 1.5])
    eps = {"eps_low": 0.2, "eps_high": 0.28}
    torch.testing.assert_close(tool.gradient_weights("dapo", ratios, 1.0, **eps), torch.tensor([0.5, 1.0, 0.0]))
    torch.testing.assert_close(tool.gradient_weights("gppo", ratios, 1.0, **eps), torch.tensor([0.5, 1.0, 1.28]))
    torch.testing.assert_close(tool.gradient_weights("gppo", ratios, -1.0, **eps), torch.tensor([0.8, 1.0, 1.5]))
    torch.testing.assert_close(tool.gradient_weights("cispo", ratios, -1.0, **eps), torch.tensor([0.8, 1.0, 1.28]))


def test_png_is_written_with_every_registered_objective(tool, tmp_path, capsys):
    path = tmp_path / "objectives.png"
    tool.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert "test-soft-clip" in capsys.readouterr().out
