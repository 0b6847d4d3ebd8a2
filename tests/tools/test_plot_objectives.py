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


def test_weights_of_the_schemes_beyond_the_ratio_clip(tool):
    ratios = torch.tensor([0.5, 1.2, 2.0])
    # SAPO, tau 1: F = r sech^2((r - 1) / 2): 0.47 at 0.5, 1.18 at 1.2, 1.57 at 2 (its peak).
    expected = ratios / torch.cosh((ratios - 1) / 2) ** 2
    torch.testing.assert_close(tool.gradient_weights("sapo", ratios, 1.0), expected)
    # DPPO-TV, delta 0.15, p_old 0.3: p - p_old = 0.3 (r - 1) = -0.15, 0.06, 0.3; A > 0 masks r = 2 only
    # (0.3 > 0.15), A < 0 masks nothing (-0.15 is not below -0.15); the others keep the weight r.
    torch.testing.assert_close(tool.gradient_weights("dppo-tv", ratios, 1.0), torch.tensor([0.5, 1.2, 0.0]))
    torch.testing.assert_close(tool.gradient_weights("dppo-tv", ratios, -1.0), torch.tensor([0.5, 1.2, 2.0]))
    # GMPO on one-token sequences, log-space bounds 0.4: r = 2 > e^0.4 = 1.49 is clipped for A > 0 (no gradient),
    # r = 0.5 < e^-0.4 = 0.67 for A < 0.
    torch.testing.assert_close(tool.gradient_weights("gmpo", ratios, 1.0), torch.tensor([0.5, 1.2, 0.0]))
    torch.testing.assert_close(tool.gradient_weights("gmpo", ratios, -1.0), torch.tensor([0.0, 1.2, 2.0]))
    # ERC with equal entropies: every token in its band, so DAPO's weights (0.2 / 0.28: r = 2 clipped for A > 0).
    dapo = tool.gradient_weights("dapo", ratios, 1.0, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(tool.gradient_weights("dapo-erc", ratios, 1.0, eps_low=0.2, eps_high=0.28), dapo)


def test_png_is_written_with_every_registered_objective(tool, tmp_path, capsys):
    path = tmp_path / "objectives.png"
    tool.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert "test-soft-clip" in capsys.readouterr().out
