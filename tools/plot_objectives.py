"""Draw each registered objective's per-token gradient weight F against the ratio r (g = dL/dx = -F * A).

One panel per objective, with A > 0 and A < 0 and PPO's weight behind for reference. Every objective in the
registry is drawn, so a user subclass appears once its module is imported (``--import my_package.objectives``).
The weights are measured with autograd on the real objective classes, not re-derived, so the picture is exactly
what training uses. Clip ranges are set to 0.2 / 0.28 for every objective that takes them (GSPO's paper range,
3e-4 / 4e-4, would be invisible; on a one-token sequence its sequence ratio, and GMPO's geometric mean, is the
token ratio; GMPO's own bounds are in log space). The behaviour policy gives every token probability
``P_OLD`` (DPPO's mask reads the probabilities themselves, ``p - p_old = P_OLD * (r - 1)``); ERC gets equal current
and old entropies, so every token is in its entropy band and it draws as its base scheme. Clip-Cov and KL-Cov
select by the covariance of advantage and log-prob over the batch, which is 0 here (one advantage per panel), so
they draw as the weight of the tokens they do not select (PPO clip, and the plain ``-A * r``); KL-Cov still
selects at least one token, the spike at the panel's left edge (``-A * r + coef * sign(x - x_old)``).

    python tools/plot_objectives.py --out docs/objectives.png [--import pkg.module ...] [--dual-clip 3]
"""

from __future__ import annotations

import argparse
import importlib
import inspect

import torch

from klear.objectives import get_objective, list_objectives, objective_class

P_OLD = 0.3
"""The behaviour policy's probability of every drawn token (``r`` up to ``1 / P_OLD`` keeps ``p <= 1``)."""


def gradient_weights(name: str, ratios: torch.Tensor, advantage: float, **overrides: float) -> torch.Tensor:
    """F(r) = -(dL/dx) / A for one-token sequences at each ratio, with x = log(P_OLD * r) and x_old = log P_OLD."""
    accepted = inspect.signature(objective_class(name).__init__).parameters
    objective = get_objective(name, **{key: value for key, value in overrides.items() if key in accepted})
    old = torch.full((len(ratios), 1), P_OLD).log()
    logprobs = (old + ratios.log()[:, None]).requires_grad_(True)
    mask = torch.ones_like(logprobs, dtype=torch.bool)
    advantages = torch.full((len(ratios),), advantage)
    entropy = (
        {"entropy": torch.ones_like(old), "old_entropy": torch.ones_like(old)} if objective.traits.needs_entropy else {}
    )
    # A normaliser of 1 over one-token rows: every aggregation gives each token its own gradient.
    output = objective(logprobs, old, advantages, mask, normalizer=1.0, **entropy)
    output.loss.backward()
    return -logprobs.grad[:, 0] / advantage


def plot(path: str, dual_clip: float | None = None, columns: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overrides = {"eps_low": 0.2, "eps_high": 0.28}
    if dual_clip is not None:
        overrides["dual_clip"] = dual_clip
    ratios = torch.linspace(0.02, 3.0, 600)
    names = list_objectives()
    rows = -(-len(names) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), sharex=True, sharey=True)
    axes = axes.reshape(-1)
    reference = {advantage: gradient_weights("ppo", ratios, advantage, **overrides) for advantage in (1.0, -1.0)}
    for panel, name in zip(axes, names, strict=False):
        panel.axvspan(0.8, 1.28, color="grey", alpha=0.12, linewidth=0)
        for advantage, color in ((1.0, "tab:blue"), (-1.0, "tab:red")):
            sign = "A > 0" if advantage > 0 else "A < 0"
            if name != "ppo":
                panel.plot(ratios, reference[advantage], color=color, alpha=0.25, linewidth=5)
            weights = gradient_weights(name, ratios, advantage, **overrides)
            panel.plot(
                ratios, weights, color=color, linewidth=1.8, label=sign, linestyle="-" if advantage > 0 else "--"
            )
        panel.set_title(name)
        panel.grid(alpha=0.3)
    for panel in axes[len(names) :]:
        panel.axis("off")
    for panel in axes[(rows - 1) * columns :]:
        panel.set_xlabel("ratio r = pi / pi_old")
    for panel in axes[::columns]:
        panel.set_ylabel("F   (g = -F * A)")
    axes[0].legend(loc="upper left", fontsize=8)
    suffix = f", dual clip {dual_clip}" if dual_clip is not None else ""
    figure.suptitle(
        f"Per-token gradient weight F; 0 = no gradient. eps 0.2 / 0.28 (shaded){suffix}; wide pale lines: ppo"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"wrote {path} ({len(names)} objectives: {', '.join(names)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/objectives.png")
    parser.add_argument("--import", dest="imports", action="append", default=[], help="module registering objectives")
    parser.add_argument("--dual-clip", type=float, default=None, help="dual clip c for objectives that take it")
    args = parser.parse_args()
    for module in args.imports:
        importlib.import_module(module)
    plot(args.out, args.dual_clip)


if __name__ == "__main__":
    main()
