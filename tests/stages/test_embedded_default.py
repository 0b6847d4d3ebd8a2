"""The promises of the embedded defaults (arithmetic and code), run as the README runs them (slow: minutes each on 2
CPU cores)."""

import csv

import pytest

from klear.fit import main

pytestmark = pytest.mark.end_to_end  # runs `klear.fit` main() (whole training runs)


def evals(path) -> list[float]:
    with (path / "metrics.csv").open(newline="") as file:
        return [float(row["eval/accuracy"]) for row in csv.DictReader(file) if row["eval/accuracy"]]


@pytest.mark.slow
def test_sft_default_leaves_headroom_for_rl(tmp_path):
    assert main(["--config", "configs/sft.yaml", f"output_dir={tmp_path}", "trainer.progress_bar=false"]) == 0
    accuracy = evals(tmp_path)
    assert accuracy[0] == 0.0 and 0.2 <= accuracy[-1] <= 0.6, accuracy


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["ppo", "dapo", "cispo", "gppo"])
def test_rl_main_command_gains_20_points(objective, tmp_path):
    args = ["--config", "configs/rl.yaml", "--objective", objective, f"output_dir={tmp_path}"]
    assert main([*args, "trainer.progress_bar=false"]) == 0
    accuracy = evals(tmp_path)
    assert accuracy[-1] >= accuracy[0] + 0.2, accuracy


@pytest.mark.slow
def test_sft_code_default_leaves_headroom_for_rl(tmp_path):
    assert main(["--config", "configs/sft_code.yaml", f"output_dir={tmp_path}", "trainer.progress_bar=false"]) == 0
    accuracy = evals(tmp_path)
    assert accuracy[0] == 0.0 and 0.2 <= accuracy[-1] <= 0.8, accuracy


@pytest.mark.slow
def test_code_rl_main_command_gains_15_points(tmp_path):
    args = ["--config", "configs/rl_code.yaml", "--objective", "gppo", f"output_dir={tmp_path}"]
    assert main([*args, "trainer.progress_bar=false"]) == 0
    accuracy = evals(tmp_path)
    assert accuracy[-1] >= accuracy[0] + 0.15, accuracy


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["ppo", "dapo", "cispo", "gppo"])
def test_rl_main_command_one_step_stale_ends_within_3_points_of_synchronous(objective, tmp_path):
    """docs/results.md: the main command with rollout.max_staleness=1 against the synchronous one, seed 0."""
    final = {}
    for staleness in (0, 1):
        output = tmp_path / f"staleness-{staleness}"
        args = ["--config", "configs/rl.yaml", "--objective", objective, f"output_dir={output}"]
        assert main([*args, f"rollout.max_staleness={staleness}", "trainer.progress_bar=false"]) == 0
        final[staleness] = evals(output)[-1]
    assert final[1] >= final[0] - 0.03, final
