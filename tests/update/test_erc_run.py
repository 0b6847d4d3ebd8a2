"""ERC in training: a short RL run logs its entropy band, the config refuses it without the trainer's old-log-prob
pass (one line, before anything heavy), and the old entropy the update reads is the entropy of the policy before
the update: on-policy, the band holds every token, so ERC's first update is DAPO's."""

import copy
import random
import subprocess
import sys

import pytest
import torch

from klear.config import ModelConfig
from klear.config.load import ConfigError, load_config
from klear.fit import main
from klear.kernels.rollout_batch import ScoredGroups
from klear.models import load_model
from klear.objectives import get_objective
from klear.rollout.engine import Rollout
from klear.runtime.distributed import Ranks
from klear.schema import AlgorithmConfig, RolloutConfig
from klear.update.update import PolicyUpdate
from tests.runs import RL_SHORT, read_metrics

ENTROPY_METRICS = ["objective/entropy_clip_frac_low", "objective/entropy_clip_frac_high"]


@pytest.mark.end_to_end  # a short RL run through `klear.fit` main()
@pytest.mark.slow  # test_rl_end_to_end.py::test_every_objective_trains[dapo-erc] runs it in the default tier
def test_a_short_dapo_erc_run_logs_its_entropy_band(tmp_path):
    overrides = [*RL_SHORT, "trainer.max_steps=2", "eval.every_n_steps=0", "rollout.old_logprobs=trainer"]
    assert main(["--config", "configs/rl.yaml", "--objective", "dapo-erc", f"output_dir={tmp_path}", *overrides]) == 0
    rows = read_metrics(tmp_path / "metrics.csv")
    trained = [row for row in rows if row.get("actor/updates")]
    assert [int(row["step"]) for row in trained] == [0, 1]
    for row in trained:
        fractions = [float(row[name]) for name in ENTROPY_METRICS]
        assert all(0.0 <= value <= 1.0 for value in fractions), fractions
        assert float(row["actor/grad_norm"]) > 0


@pytest.mark.end_to_end  # the command in a fresh interpreter
def test_erc_without_the_trainers_old_logprobs_is_one_line_before_heavy_imports():
    # `python -m klear.fit --config configs/rl.yaml --objective dapo-erc`, run as a module in a fresh interpreter
    # that reports, as it exits, which heavy libraries the refusal imported.
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('heavy', sorted(name for name in ('lightning', 'transformers', 'vllm') "
        "if name in sys.modules)))\n"
        "sys.argv = ['klear.fit', '--config', 'configs/rl.yaml', '--objective', 'dapo-erc']\n"
        "runpy.run_module('klear.fit', run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "heavy []", result.stdout + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "objective 'dapo-erc' reads the old policy's entropies" in lines[0]
    assert "set rollout.old_logprobs=trainer (it is engine)" in lines[0]


def test_gppo_erc_is_refused_the_same_way():
    with pytest.raises(ConfigError, match=r"objective 'gppo-erc' .* set rollout.old_logprobs=trainer"):
        load_config("configs/rl.yaml", [], "gppo-erc")
    assert load_config("configs/rl.yaml", ["rollout.old_logprobs=trainer"], "gppo-erc").objective.name == "gppo-erc"


# ------------------------------------------------------------------ the old entropy is the pre-update policy's


def scored_groups(seed: int = 0) -> tuple[ScoredGroups, torch.Tensor]:
    """Two groups of four rollouts of random tokens, with advantages of both signs."""
    rng = random.Random(seed)
    groups = []
    for group in range(2):
        rollouts = []
        for _ in range(4):
            response = [rng.randrange(3, 90) for _ in range(rng.randrange(3, 12))]
            logprobs = [-rng.uniform(1.0, 5.0) for _ in response]  # the engine's: unused with trainer old log-probs
            rollouts.append(
                Rollout(group, [7, 8, 9, 10 + group], response, "", logprobs=logprobs, finish_reason="stop")
            )
        groups.append(rollouts)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    advantages = rewards - rewards.mean(dim=1, keepdim=True)
    return ScoredGroups(groups, rewards, rewards, rewards > 0), advantages


def first_updates(model, objective, epochs: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The step's updates through `PolicyUpdate.run` (trainer old log-probs, one mini-batch); the first one's
    gradients."""
    model = copy.deepcopy(model)
    algorithm = AlgorithmConfig(micro_batch_size=3, epochs=epochs, mini_batch_prompts=2)
    rollout = RolloutConfig(group_size=4, temperature=0.9, max_new_tokens=12, old_logprobs="trainer")
    update = PolicyUpdate(objective, algorithm, rollout, seed=0, grad_clip=0.0, pad_token_id=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    gradients: list[dict[str, torch.Tensor]] = []

    def backward(loss):
        loss.backward()
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    scored, advantages = scored_groups()
    metrics = update.run(model, scored, advantages, 1, optimizer, backward, Ranks())
    micro_batches = -(-8 // 3)  # the first update's accumulated gradient is complete after its last micro-batch
    return metrics, gradients[micro_batches - 1]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model(ModelConfig(path="tiny"))


@pytest.mark.parametrize("band", [0.05, 1e-4])
def test_on_policy_the_first_erc_update_is_dapos(tiny, band):
    # On-policy the old entropy is the current one (up to float noise), rho = 1: even a band of +-1e-4 holds every
    # token. An old entropy from another temperature, another model or after the update would not.
    erc = get_objective("dapo-erc", entropy_eps_low=band, entropy_eps_high=band)
    metrics, erc_gradients = first_updates(tiny, erc, epochs=1)
    _, dapo_gradients = first_updates(tiny, get_objective("dapo"), epochs=1)
    assert metrics["objective/entropy_clip_frac_low"] == metrics["objective/entropy_clip_frac_high"] == 0.0
    assert erc_gradients.keys() == dapo_gradients.keys()
    assert any(gradient.abs().sum() > 0 for gradient in erc_gradients.values())
    for name, gradient in dapo_gradients.items():
        torch.testing.assert_close(erc_gradients[name], gradient, rtol=1e-6, atol=1e-8, msg=name)


def test_the_band_bites_once_the_policy_has_moved(tiny):
    # The second epoch reads the same old entropies after an lr = 1 step: a narrow band now clips tokens.
    erc = get_objective("dapo-erc", entropy_eps_low=1e-3, entropy_eps_high=1e-3)
    metrics, _ = first_updates(tiny, erc, epochs=2)
    assert metrics["actor/updates"] == 2
    assert metrics["objective/entropy_clip_frac_low"] + metrics["objective/entropy_clip_frac_high"] > 0.1
