"""Clip-Cov and KL-Cov by hand: 3-token examples, the draw's seeding, edge cases, declarations, validation.

The 3-token examples use one sequence with per-token advantages A = (2, -1, -1) (mean 0) and current log-probs
x = (-1, -4, -4) (mean -3), so Cov_t = (A_t - 0) * (x_t + 3) = (2*2, -1*-1, -1*-1) = (4, 1, 1): token 0 is inside
Clip-Cov's open window (1, 5), tokens 1 and 2 sit on its edge (not candidates), and token 0 is KL-Cov's top-1.
N = 3, so k = max(floor(2e-4 * 3), 1) = 1 (Clip-Cov) and max(1, floor(3 * 2e-3)) = 1 (KL-Cov). x_old = x - log r.
"""

import pytest
import torch

from klear.objectives import ClipCov, KLCov, Objective, PolicyObjective, Traits, get_objective

pytestmark = pytest.mark.unit

X = [-1.0, -4.0, -4.0]
A = [2.0, -1.0, -1.0]


def run(objective, ratios, x=X, advantages=A, seed=0):
    """Loss, dL/dx and metrics of one forward on one sequence with x_old = x - log r."""
    logprobs = torch.tensor([x], requires_grad=True)
    old = torch.tensor([x]) - torch.tensor([ratios]).log()
    mask = torch.ones(1, len(x), dtype=torch.bool)
    output = objective(logprobs, old, torch.tensor([advantages]), mask, seed=seed)
    output.loss.backward()
    return output.loss.item(), logprobs.grad[0].tolist(), {k: float(v) for k, v in output.metrics.items()}


def test_clip_cov_detaches_the_one_candidate():
    # r = (1.1, 0.9, 1.0), eps 0.2: no token is PPO-clipped (A > 0 needs r > 1.2, A < 0 needs r < 0.8).
    # Candidates: token 0 only (Cov 4 in (1, 5)); min(k=1, 1) = 1 token drawn, whatever the seed: token 0.
    # Token losses (0, -A*r = 0.9, 1.0), token-mean (0 + 0.9 + 1.0) / 3 = 0.633333.
    # dL/dx = (0, -A*r/3, -A*r/3) = (0, 0.3, 0.333333).
    loss, grad, metrics = run(get_objective("clip-cov"), [1.1, 0.9, 1.0])
    assert loss == pytest.approx(0.633333, abs=1e-6)
    assert grad == pytest.approx([0.0, 0.3, 0.333333], abs=1e-6)
    assert metrics["cov_selected_frac"] == pytest.approx(1 / 3)
    assert metrics["cov_candidate_frac"] == pytest.approx(1 / 3)


def test_clip_cov_never_draws_a_ppo_clipped_token():
    # r0 = 1.5 > 1.2 with A0 = 2: PPO clips it (-A*clip(r) = -2.4 > -A*r = -3), so it is no candidate, and Cov 1
    # of tokens 1, 2 is not strictly inside (1, 5): nothing is drawn, the loss is PPO clip's.
    # Token losses (-2.4, 0.9, 1.0): loss (-2.4 + 0.9 + 1.0) / 3 = -0.166667; dL/dx = (0, 0.3, 0.333333).
    loss, grad, metrics = run(get_objective("clip-cov"), [1.5, 0.9, 1.0])
    assert loss == pytest.approx(-0.166667, abs=1e-6)
    assert grad == pytest.approx([0.0, 0.3, 0.333333], abs=1e-6)
    assert metrics["cov_selected_frac"] == 0.0 and metrics["cov_candidate_frac"] == 0.0
    ppo_loss, ppo_grad, _ = run(get_objective("ppo"), [1.5, 0.9, 1.0])
    assert loss == pytest.approx(ppo_loss, abs=1e-7) and grad == pytest.approx(ppo_grad, abs=1e-7)


def test_clip_cov_without_a_lower_bound():
    # The authors' bounds (eps_low=None, eps_high=1): r1 = 0.5 with A1 = -1 is not clipped (no lower bound), and
    # r0 = 1.5 < 2 is not either, so token 0 (Cov 4) is a candidate again and is drawn.
    # Token losses (0, 0.5, 1.0): loss 0.5; dL/dx = (0, 0.5/3, 1/3) = (0, 0.166667, 0.333333).
    loss, grad, _ = run(get_objective("clip-cov", eps_low=None, eps_high=1.0), [1.5, 0.5, 1.0])
    assert loss == pytest.approx(0.5, abs=1e-6)
    assert grad == pytest.approx([0.0, 0.166667, 0.333333], abs=1e-6)


def test_kl_cov_penalises_the_top_covariance_token():
    # r = (1.5, 0.9, 1.0), no clipping. Token 0 (largest Cov, 4) gets + coef * |x - x_old| = log 1.5 = 0.405465.
    # Token losses (-2*1.5 + 0.405465, 0.9, 1.0) = (-2.594535, 0.9, 1.0): loss -0.694535 / 3 = -0.231512.
    # dL/dx = (-A*r + coef*sign(log r), -A*r, -A*r) / 3 = (-3 + 1, 0.9, 1) / 3 = (-0.666667, 0.3, 0.333333).
    loss, grad, metrics = run(get_objective("kl-cov"), [1.5, 0.9, 1.0])
    assert loss == pytest.approx(-0.231512, abs=1e-6)
    assert grad == pytest.approx([-0.666667, 0.3, 0.333333], abs=1e-6)
    assert metrics["cov_selected_frac"] == pytest.approx(1 / 3)


def test_kl_cov_penalty_below_the_old_policy():
    # coef 0.5, r0 = 0.5 (x below x_old): token 0 L = -2*0.5 + 0.5*log 2 = -0.653426, dL/dx = -1 - 0.5 = -1.5.
    # Loss (-0.653426 + 0.9 + 1.0) / 3 = 0.415525; dL/dx = (-0.5, 0.3, 0.333333).
    loss, grad, _ = run(get_objective("kl-cov", kl_cov_coef=0.5), [0.5, 0.9, 1.0])
    assert loss == pytest.approx(0.415525, abs=1e-6)
    assert grad == pytest.approx([-0.5, 0.3, 0.333333], abs=1e-6)


def test_kl_cov_penalty_value_is_not_clamped():
    # |x - x_old| = 30 past the log-ratio clamp (20): the penalty's value is 30 (as verl), its gradient sign = +1.
    objective = get_objective("kl-cov", kl_cov_coef=1.0)
    logprobs = torch.tensor([[-1.0]], requires_grad=True)
    output = objective(logprobs, torch.tensor([[-31.0]]), torch.tensor([0.0]), torch.ones(1, 1, dtype=torch.bool))
    output.loss.backward()
    assert output.loss.item() == pytest.approx(30.0) and logprobs.grad.item() == pytest.approx(1.0)


def many(seed: int = 0, rows: int = 8, length: int = 64) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = -torch.rand(rows, length, generator=generator) * 6
    return {
        "logprobs": x,
        "old_logprobs": x + torch.randn(rows, length, generator=generator) * 0.1,
        "advantages": torch.randn(rows, generator=generator) * 1.5,
        "mask": torch.ones(rows, length, dtype=torch.bool),
    }


def loss_and_grad(objective, data, normalizer=None, seed=0):
    x = data["logprobs"].clone().requires_grad_(True)
    output = objective(x, data["old_logprobs"], data["advantages"], data["mask"], normalizer, seed=seed)
    output.loss.backward()
    return output, x.grad


def test_the_draw_depends_on_the_seed_alone_and_leaves_the_global_generator_alone():
    # Many candidates, k = 25: the same seed draws the same tokens (a resumed run), another seed others.
    objective, data = get_objective("clip-cov", clip_cov_ratio=0.05), many()
    state = torch.get_rng_state()
    first, again, other = (loss_and_grad(objective, data, seed=s)[1] for s in (7, 7, 8))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    dropped = lambda grad: set(torch.nonzero(grad.flatten() == 0).flatten().tolist())  # noqa: E731
    assert len(dropped(first)) == len(dropped(other)) and dropped(first) != dropped(other)


def test_prepare_runs_once_per_forward():
    # The loss and the gradient metrics read one draw: prepare is called once, the surrogate twice.
    class Counted(ClipCov):
        calls = 0

        def prepare(self, ratio, advantages, inputs):
            type(self).calls += 1
            return super().prepare(ratio, advantages, inputs)

    loss_and_grad(Counted(clip_cov_ratio=0.05), many())
    assert Counted.calls == 1


@pytest.mark.parametrize(("name", "hyperparameters"), [("clip-cov", {}), ("kl-cov", {})])
def test_split_dependence(name, hyperparameters, record_property):
    # Statistics per call (verl's scope): one call over the step vs 2 and 4 micro-batch calls with the step's
    # normaliser. The means, N and k differ per call (k = max(., 1) grows with the number of calls), so the
    # accumulated gradient differs; the relative L2 difference is recorded for the docs.
    objective, data = get_objective(name, **hyperparameters), many(seed=5, rows=16)
    whole = loss_and_grad(objective, data)[1]
    tokens = data["mask"].sum().float()
    for parts in (2, 4):
        rows = len(data["mask"]) // parts
        split = torch.cat(
            [
                loss_and_grad(objective, {k: v[i * rows : (i + 1) * rows] for k, v in data.items()}, tokens, i)[1]
                for i in range(parts)
            ]
        )
        difference = ((split - whole).norm() / whole.norm()).item()
        record_property(f"{name}_split_{parts}", difference)
        print(f"{name}: {parts} micro-batches, relative gradient difference {difference:.4f}")
        assert difference > 1e-3


def test_masked_padding_never_reaches_the_loss(padded_batch):
    clean = {k: torch.where(padded_batch["mask"], v, 0.0) if v.dim() == 2 else v for k, v in padded_batch.items()}
    for name in ("clip-cov", "kl-cov"):
        objective = get_objective(name, **({"clip_cov_ratio": 0.5, "clip_cov_lb": 0.0} if name == "clip-cov" else {}))
        dirty_out, dirty_grad = loss_and_grad(objective, padded_batch)
        clean_out, clean_grad = loss_and_grad(objective, clean)
        assert torch.isfinite(dirty_out.loss) and torch.isfinite(dirty_grad).all()
        assert dirty_out.loss.item() == clean_out.loss.item() and torch.equal(dirty_grad, clean_grad)
        assert (dirty_grad[~padded_batch["mask"]] == 0).all()


@pytest.mark.parametrize("name", ["clip-cov", "kl-cov"])
def test_bf16_inputs(name):
    data = many(seed=3)
    full = loss_and_grad(get_objective(name), data)
    half = loss_and_grad(
        get_objective(name), {k: v.bfloat16() if v.is_floating_point() else v for k, v in data.items()}
    )
    assert half[1].dtype == torch.bfloat16 and torch.isfinite(half[1].float()).all()
    assert half[0].loss.item() == pytest.approx(full[0].loss.item(), abs=0.05)


def test_zero_advantages():
    # A = 0: every Cov_t is 0, outside Clip-Cov's window: nothing drawn, loss 0, no gradient. KL-Cov's
    # max(., 1) floor still penalises one token (a tie at Cov = 0, as in verl): loss |x_j - x_old_j| / N.
    data = {**many(seed=4), "advantages": torch.zeros(8)}
    output, grad = loss_and_grad(get_objective("clip-cov"), data)
    assert output.loss.item() == 0.0 and (grad == 0).all() and float(output.metrics["cov_selected_frac"]) == 0.0
    output, grad = loss_and_grad(get_objective("kl-cov"), data)
    assert (grad != 0).sum().item() == 1
    penalised = (grad != 0).flatten().nonzero().item()
    diff = (data["logprobs"] - data["old_logprobs"]).flatten()[penalised].abs().item()
    assert output.loss.item() == pytest.approx(diff / data["mask"].sum().item(), rel=1e-5)


@pytest.mark.parametrize("name", ["clip-cov", "kl-cov"])
def test_empty_mask(name):
    data = {**many(seed=6), "mask": torch.zeros(8, 64, dtype=torch.bool)}
    output, grad = loss_and_grad(get_objective(name), data)
    assert output.loss.item() == 0.0 and (grad == 0).all()
    own = [key for key in output.metrics if key.startswith("cov_")]
    assert own and all(float(output.metrics[key]) == 0.0 for key in own)


def test_declarations_and_defaults():
    clip, kl = get_objective("clip-cov"), get_objective("kl-cov")
    for objective in (clip, kl):
        assert objective.traits == Traits(advantage_linear=False, batch_statistics=True)
    assert isinstance(clip, PolicyObjective) and ClipCov.allows_no_lower_bound
    assert isinstance(kl, Objective) and not isinstance(kl, PolicyObjective) and isinstance(kl, KLCov)
    assert clip.hyperparameters() == {
        "eps_low": 0.2,
        "eps_high": 0.2,
        "clip_cov_ratio": 2e-4,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
        "loss_agg": "token-mean",
    }
    assert kl.hyperparameters() == {"kl_cov_ratio": 2e-3, "kl_cov_coef": 1.0, "loss_agg": "token-mean"}
    with pytest.raises(ValueError, match="no hyperparameter 'eps_low'"):
        get_objective("kl-cov", eps_low=0.2)


@pytest.mark.parametrize(
    ("name", "hyperparameters", "message"),
    [
        ("clip-cov", {"clip_cov_ratio": 0.0}, r"^clip_cov_ratio must be in \(0, 1\] .*not a percentage\), got 0.0$"),
        ("clip-cov", {"clip_cov_ratio": 2.0}, r"^clip_cov_ratio must be in \(0, 1\] .*, got 2.0$"),
        ("clip-cov", {"clip_cov_lb": 5.0}, r"^clip_cov_lb must be < clip_cov_ub, got 5.0 and 5.0$"),
        ("clip-cov", {"eps_high": -1.0}, r"^eps_high must be >= 0, got -1.0$"),
        ("kl-cov", {"kl_cov_ratio": -1e-3}, r"^kl_cov_ratio must be in \(0, 1\] .*, got -0.001$"),
        ("kl-cov", {"kl_cov_coef": -1.0}, r"^kl_cov_coef must be >= 0, got -1.0$"),
        ("kl-cov", {"kl_cov_coef": float("nan")}, r"^kl_cov_coef must be >= 0, got nan$"),
    ],
)
def test_invalid_hyperparameters(name, hyperparameters, message):
    with pytest.raises(ValueError, match=message):
        get_objective(name, **hyperparameters)
