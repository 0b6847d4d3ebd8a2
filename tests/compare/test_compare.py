"""python -m klear.compare through its real CLI: every run, reports consistent with the CSV, identical step-0
rollouts across objectives for a seed, resume skips finished runs, a failing run is reported and the rest kept."""

import csv
import re

import pytest
from torch import Tensor

from klear.compare.cli import main, parse_args, parse_seeds, plan
from klear.compare.report import answers_section, area_under_curve
from klear.compare.runs import Run
from klear.config.load import ConfigError
from klear.eval.stats import holm, mean_ci, paired_t_test, seeds_needed, t_quantile
from klear.objectives import PolicyObjective
from klear.run.samples_log import last_evaluated
from tests.test_user_errors import klear as run_command
from tests.test_user_errors import one_line_error

pytestmark = pytest.mark.end_to_end  # runs `klear.compare` (whole training runs)

SHORT = [
    "model.path=tiny",
    "reward.name=tests.stages:even_length",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "algorithm.mini_batch_prompts=1",
    "trainer.max_steps=3",
    "eval.num_prompts=4",
    "eval.max_new_tokens=8",
    "eval.every_n_steps=1",
    "data.num_train=16",
    "data.num_eval=4",
    "optim.lr=3e-3",
    "optim.warmup_steps=0",
]


class Broken(PolicyObjective):
    """An objective that fails at its first step, to check that a failed run does not lose the others."""

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        raise RuntimeError("broken on purpose")


def read_csv(path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """docs/compare.md's command as a user types it (``python -m klear.compare``), shortened by overrides."""
    output = tmp_path_factory.mktemp("compare")
    args = ["--config", "configs/rl.yaml", "--objectives", "ppo,gppo", "--seeds", "0,1", "--jobs", "2"]
    result = run_command("klear.compare", *args, f"output_dir={output}", *SHORT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return output, args, result.stdout


def test_files_and_every_run(comparison):
    output, _, stdout = comparison
    assert {path.name for path in output.iterdir()} >= {"comparison.csv", "comparison.md", "comparison.png", "runs"}
    assert "comparison.png" in stdout and "| ppo |" in (output / "comparison.md").read_text()
    rows = read_csv(output / "comparison.csv")
    assert {(row["label"], row["seed"]) for row in rows} == {("ppo", "0"), ("ppo", "1"), ("gppo", "0"), ("gppo", "1")}
    assert sorted({row["step"] for row in rows}) == ["0.0", "1.0", "2.0", "3.0"]


def test_step_zero_rollouts_are_identical_across_objectives(comparison):
    rows = read_csv(comparison[0] / "comparison.csv")
    first = {(row["label"], row["seed"]): row for row in rows if row["step"] == "0.0"}
    for seed in ("0", "1"):
        for key in ("reward/mean", "rollout/response_length", "eval/accuracy"):
            assert first[("ppo", seed)][key] == first[("gppo", seed)][key], key
    assert first[("ppo", "0")]["rollout/response_length"] != first[("ppo", "1")]["rollout/response_length"]


def test_table_matches_the_csv(comparison):
    output, *_ = comparison
    rows = read_csv(output / "comparison.csv")
    table = (output / "comparison.md").read_text()
    for label in ("ppo", "gppo"):
        finals = []
        for seed in ("0", "1"):
            evals = [row for row in rows if row["label"] == label and row["seed"] == seed and row["eval/accuracy"]]
            finals.append(float(max(evals, key=lambda row: float(row["step"]))["eval/accuracy"]))
        line = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
        assert line.split("|")[4].strip() == cell(finals), line
    number = r"[+-]\d\.\d{3}"
    verdict = rf"- gppo - ppo: {number} \[{number}, {number}\], p_holm = \d\.\d{{3}}: "
    assert re.search(verdict + r"(\*\*gppo (higher|lower)\*\*|not distinguishable at 2 seeds)", table), table
    assert table.count("- gppo - ppo:") == 4  # final accuracy, AUC, final - best, final pass@4
    assert "## Against the baseline, ppo" in table
    assert "| gppo |" in table.split("Diagnostics:")[1]  # the diagnostics table
    # the evaluation samples 4 answers: pass@4 at the last evaluation; no maj@4, the function reward gives no votes
    assert "| run | final pass@4 |\n|---|---|\n| ppo | " in table and "maj@4" not in table


def test_rerun_skips_finished_runs(comparison, capsys):
    output, args, _ = comparison
    before = {path: path.stat().st_mtime for path in output.glob("runs/*/metrics.csv")}
    assert main([*args, f"output_dir={output}", *SHORT]) == 0
    assert capsys.readouterr().out.count("skip ") == 4
    assert {path: path.stat().st_mtime for path in output.glob("runs/*/metrics.csv")} == before


@pytest.mark.slow  # the default run keeps a comparison whose every run fails (tests/test_user_errors.py)
def test_a_failed_run_is_reported_and_the_others_kept(tmp_path, capsys):
    objectives = f"dapo,{__name__}:Broken"
    args = ["--config", "configs/rl.yaml", "--objectives", objectives, "--seeds", "0", f"output_dir={tmp_path}"]
    assert main([*args, *SHORT, "trainer.max_steps=1"]) == 1
    table = (tmp_path / "comparison.md").read_text()
    assert "Failed runs" in table and f"{__name__}_Broken-seed0" in table
    assert "| dapo | 1 |" in table
    assert "FAILED" in capsys.readouterr().out


def test_bad_arguments_stop_before_any_run(tmp_path, capsys):
    assert main(["--config", "configs/rl.yaml", "--objectives", "ppo,gpo", f"output_dir={tmp_path}"]) == 2
    assert "unknown objective 'gpo'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main(["--config", "configs/rl.yaml", "--objectives", "ppo", "--variants", "nolabel"]) == 2
    assert "--variants 'nolabel' must look like label:key=value" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")  # each run would fail on it: the comparison stops before the first, naming the file
    assert (
        main(
            ["--config", "configs/rl.yaml", "--objectives", "ppo,dapo", f"data.train={empty}", f"output_dir={tmp_path}"]
        )
        == 2
    )
    assert capsys.readouterr().err == f"error: {empty}: no usable problem in 0 rows\n"
    assert not (tmp_path / "runs").exists()


def test_statistics_by_hand():
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-5)
    assert t_quantile(0.975, 30) == pytest.approx(2.042272, abs=1e-5)
    assert mean_ci([1.0, 2.0, 3.0]) == pytest.approx((2.0, 4.302653 / 3**0.5), abs=1e-5)
    # differences 0.5, 0.1, 0.9, 1.0: mean 0.625, sd 0.4113, t = 3.039 on 3 df -> p = 0.0559
    assert paired_t_test([1, 2, 3, 4], [0.5, 1.9, 2.1, 3.0]) == pytest.approx(0.0559, abs=1e-3)
    assert area_under_curve([(0, 0.0), (10, 1.0), (20, 1.0)]) == pytest.approx(0.75)


def test_holm_and_seeds_needed_by_hand():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04): back in the input's order
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    # Effect size 1 (mean = sd): 10 pairs, as in the textbook tables for a paired t-test at alpha .05, power .8.
    sd = (8 / 7) ** 0.5  # the sample sd of [m - 1, m + 1] * 4, whatever m
    assert seeds_needed([sd - 1, sd + 1] * 4) == 10
    assert seeds_needed([sd / 2 - 1, sd / 2 + 1] * 4) == 34  # effect size 0.5
    assert seeds_needed([0.1, 0.1, 0.1]) == 2  # no spread: any two seeds show it
    assert seeds_needed([1.0, -1.0]) == 10_000  # no difference at all


def test_seed_ranges():
    assert parse_seeds("0-9") == list(range(10))
    assert parse_seeds("0-2,7,3") == [0, 1, 2, 7, 3]
    for bad in ("a", "3-1", "-1", "1,,2", "0-"):
        with pytest.raises(ConfigError, match="--seeds must be"):
            parse_seeds(bad)
    for bad in ("0-99999999999999999999", "9223372036854775808", "0-999,5000"):  # 2**63; 1001 seeds
        with pytest.raises(ConfigError, match=r"^--seeds must name at most 1000 seeds, each below 2\*\*63"):
            parse_seeds(bad)
    assert len(parse_seeds("0-999")) == 1000 and parse_seeds("9223372036854775807") == [2**63 - 1]


def test_baseline_must_be_a_label(tmp_path, capsys):
    args = ["--config", "configs/rl.yaml", "--objectives", "ppo,gppo", "--baseline", "dapo", f"output_dir={tmp_path}"]
    assert main(args) == 2
    assert "--baseline 'dapo' is not a label of this comparison" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_training_curves_are_drawn_as_a_centred_moving_average():
    from klear.compare.report import smoothed

    # Window 5: two steps each side, fewer at the ends.
    assert smoothed({0: 0, 1: 10, 2: 20, 3: 30, 4: 40, 5: 50}) == {0: 10, 1: 15, 2: 20, 3: 30, 4: 35, 5: 40}
    assert smoothed({3: 1.0}) == {3: 1.0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--objectives", "ppo,ppo"], "--objectives names objective 'ppo' more than once; give each objective once"),
        (["--objectives", "ppo", "--seeds", "0,0"], "--seeds names seed 0 more than once; give each seed once"),
        (["--objectives", "ppo", "--seeds", "0-3,2"], "--seeds names seed 2 more than once"),
        (["--objectives", "ppo", "--variants", "a:x=1", "--variants", "a:y=2"], "--variants names label 'a' more"),
    ],
    ids=["objectives", "seeds", "seed-in-range", "variant-labels"],
)
def test_a_run_named_twice_is_refused_before_any_run(tmp_path, args, message):
    result = run_command("klear.compare", "--config", "configs/rl.yaml", *args, f"output_dir={tmp_path}", timeout=60)
    assert message in one_line_error(result)
    assert not (tmp_path / "runs").exists()


def finished_runs(output, accuracy: dict[int, list[float]], reward: dict[int, list[float]]) -> None:
    """Runs of ``ppo`` that finished, as a comparison leaves them: ``metrics.csv`` (steps 0-3) and ``done.json``."""
    for seed in accuracy:
        directory = output / "runs" / f"ppo-seed{seed}"
        directory.mkdir(parents=True)
        lines = ["step,eval/accuracy,reward/mean"]
        lines += [f"{step},{a},{r}" for step, (a, r) in enumerate(zip(accuracy[seed], reward[seed], strict=True))]
        (directory / "metrics.csv").write_text("\n".join(lines) + "\n")
        (directory / "done.json").write_text('{"seconds": 1.0}')


def test_bands_of_fractions_stay_in_their_range(tmp_path, capsys):
    """Three seeds with an accuracy near 0: the Student-t band reaches below 0, and comparison.png clips it there;
    a reward with a penalty below 0 keeps its band."""
    from klear.compare.report import RANGES, comparison_panels, read_run
    from klear.compare.runs import Run

    accuracy = {0: [0.0, 0.0, 0.1, 0.9], 1: [0.0, 0.1, 0.0, 1.0], 2: [0.1, 0.0, 0.0, 1.0]}
    reward = {0: [-0.2, 0.1, 0.0, 0.5], 1: [0.0, -0.1, 0.2, 0.4], 2: [0.1, 0.0, -0.3, 0.6]}
    finished_runs(tmp_path, accuracy, reward)
    args = ["--config", "configs/rl.yaml", "--objectives", "ppo", "--seeds", "0-2", f"output_dir={tmp_path}"]
    assert main(args) == 0  # in this process: a subprocess would spend 3 s importing torch for the objective check
    assert capsys.readouterr().out.count("skip ppo") == 3
    assert (tmp_path / "comparison.png").stat().st_size > 10_000

    runs = [Run("ppo", "ppo", seed, [], tmp_path / "runs" / f"ppo-seed{seed}") for seed in accuracy]
    panels = {title: lines for title, _, lines in comparison_panels(["ppo"], runs, {id(r): read_run(r) for r in runs})}
    (_, steps, means, band) = panels["eval accuracy"][0]
    assert steps == [0.0, 1.0, 2.0, 3.0] and RANGES["eval/accuracy"] == (0.0, 1.0)
    for (low, high), mean, values in zip(band, means, zip(*accuracy.values(), strict=True), strict=True):
        unclipped = mean_ci(list(values))
        assert (low, high) == pytest.approx((max(0.0, mean - unclipped[1]), min(1.0, mean + unclipped[1])))
    assert band[0][0] == 0.0 and means[0] - mean_ci([0.0, 0.0, 0.1])[1] < 0  # clipped at 0
    assert band[3][1] == 1.0 and means[3] + mean_ci([0.9, 1.0, 1.0])[1] > 1  # and at 1
    (_, _, reward_means, reward_band) = panels["reward (train samples) (5-step mean)"][0]
    assert min(low for low, _ in reward_band) < 0  # a reward's range is its own: not clipped
    assert all(low < mean < high for (low, high), mean in zip(reward_band, reward_means, strict=True))


def compare_finished(output, capsys, metrics: dict[tuple[str, int], list[str]], data_report: str = "") -> str:
    """``comparison.md`` of ppo and gppo over seeds 0 and 1, each run finished with the ``metrics.csv`` lines given
    (and ``data_report.json``): nothing trains, the reports are written from the files."""
    for (objective, seed), lines in metrics.items():
        directory = output / "runs" / f"{objective}-seed{seed}"
        directory.mkdir(parents=True)
        (directory / "metrics.csv").write_text("\n".join(lines) + "\n")
        if data_report:
            (directory / "data_report.json").write_text(data_report)
        (directory / "done.json").write_text('{"seconds": 1.0}')
    args = ["--config", "configs/rl.yaml", "--objectives", "ppo,gppo", "--seeds", "0,1", f"output_dir={output}"]
    assert main(args) == 0  # every run is finished: nothing trains
    capsys.readouterr()
    return (output / "comparison.md").read_text()


def cell(values: list[float]) -> str:
    """A table's cell: the mean ± its interval's half-width."""
    mean, half = mean_ci(values)
    return f"{mean:.3f} ± {half:.3f}"


def test_each_eval_set_has_its_final_accuracy_in_the_table(tmp_path, capsys):
    """Runs whose ``data.eval`` named two sets (``data_report.json``'s ``eval/<set>``): comparison.md gives each
    label's final ``eval/accuracy/<set>`` over its seeds; a data source's column is not a set's."""
    finals = {("ppo", 0): (0.2, 0.1), ("ppo", 1): (0.4, 0.3), ("gppo", 0): (0.5, 0.2), ("gppo", 1): (0.7, 0.2)}
    head = "step,eval/accuracy,eval/accuracy/aime24,eval/accuracy/aime25,eval/accuracy/src"
    metrics = {
        run: [head, "0,0.1,0.1,0.1,0.1", f"1,{(aime24 + aime25) / 2},{aime24},{aime25},0.9"]
        for run, (aime24, aime25) in finals.items()
    }
    sets = '{"train": {}, "eval/aime24": {}, "eval/aime25": {}}'
    table = compare_finished(tmp_path, capsys, metrics, sets)
    assert "| run | aime24 | aime25 |\n|---|---|---|\n" in table and "| src |" not in table
    assert f"| ppo | {cell([0.2, 0.4])} | {cell([0.1, 0.3])} |" in table
    assert f"| gppo | {cell([0.5, 0.7])} | {cell([0.2, 0.2])} |" in table


def test_final_pass_and_maj_at_k_are_in_the_table(tmp_path, capsys):
    """Runs whose evaluation sampled 4 answers per problem: comparison.md gives each label's final pass@4 and maj@4
    over its seeds, from the last evaluation that logged them; a set's pass@4 is not the evaluation's."""
    finals = {("ppo", 0): (0.6, 0.3), ("ppo", 1): (0.8, 0.5), ("gppo", 0): (0.9, 0.4), ("gppo", 1): (0.7, 0.4)}
    head = "step,eval/accuracy,eval/pass_at_4,eval/maj_at_4,eval/pass_at_4/aime,reward/mean"
    metrics = {
        run: [head, "0,0.1,0.2,0.1,0.2,0.5", f"1,0.3,{passed},{majority},0.9,0.6", "2,,,,,0.7"]
        for run, (passed, majority) in finals.items()
    }
    table = compare_finished(tmp_path, capsys, metrics)
    assert "| run | final pass@4 | final maj@4 |\n|---|---|---|\n" in table and "aime" not in table
    assert f"| ppo | {cell([0.6, 0.8])} | {cell([0.3, 0.5])} |" in table
    assert f"| gppo | {cell([0.9, 0.7])} | {cell([0.4, 0.4])} |" in table
    # comparison.png: their curves after the accuracy's, each band clipped to [0, 1]
    from klear.compare.report import comparison_panels, read_run

    runs = [Run(o, o, seed, [], tmp_path / "runs" / f"{o}-seed{seed}") for o in ("ppo", "gppo") for seed in (0, 1)]
    panels = comparison_panels(["ppo", "gppo"], runs, {id(run): read_run(run) for run in runs})
    assert [title for title, _, _ in panels[:3]] == ["eval accuracy", "eval pass@4", "eval maj@4"]
    (_, steps, means, band) = panels[1][2][1]  # gppo's pass@4
    assert steps == [0.0, 1.0] and means == pytest.approx([0.2, 0.8]) and band[1][1] == 1.0  # 0.8 ± 1.27, clipped
    # and each against the baseline, paired by seed: differences 0.3 and -0.1 (pass@4), 0.1 and -0.1 (maj@4)
    verdicts = table.split("## Against the baseline, ppo")[1]
    for name, differences in (("final pass@4", [0.3, -0.1]), ("final maj@4", [0.1, -0.1])):
        mean, half = mean_ci(differences)
        line = verdicts.split(f"\n{name}:\n\n")[1].split("\n")[0]
        assert line.startswith(f"- gppo - ppo: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}], p_holm = "), line


def test_verdicts_pair_the_seeds_both_labels_logged_an_outcome_for():
    """A seed whose run never logged the outcome (NaN) is left out of the pairing; a label without it has no line;
    a baseline without it, no lines at all."""
    from klear.compare.report import verdicts

    summary = {
        "ppo": {"seeds": [0, 1, 2], "eval/maj_at_4": [0.5, 0.6, float("nan")]},
        "gppo": {"seeds": [0, 1, 2], "eval/maj_at_4": [0.6, 0.8, 0.9]},
        "cispo": {"seeds": [0, 1, 2]},
    }
    (line,) = verdicts(summary, "ppo", "eval/maj_at_4")
    mean, half = mean_ci([0.1, 0.2])
    assert line.startswith(f"- gppo - ppo: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}], p_holm = "), line
    needed = seeds_needed([0.1, 0.2], 0.05, 0.8)
    assert line.endswith(f"not distinguishable at 2 seeds (about {needed} seeds for a difference this size)"), line
    assert verdicts(summary, "cispo", "eval/maj_at_4") == []


def test_the_last_output_dir_given_is_the_comparisons(tmp_path):
    args = parse_args(
        [
            "--config",
            "configs/rl.yaml",
            "--objectives",
            "gppo",
            "--seeds",
            "0",
            "output_dir=a",
            f"output_dir={tmp_path}",
        ]
    )
    output, runs = plan(args)
    assert output == tmp_path and runs[0].directory == tmp_path / "runs" / "gppo-seed0"  # as klear.fit takes overrides


def test_answers_show_each_labels_answer_at_the_last_evaluation(comparison):
    output, *_ = comparison
    table, answers = (output / "comparison.md").read_text().split("\n## Answers\n")
    assert "| ppo |" in table and answers.count("Reference: `") == 1  # one problem: every label had the same
    for label in ("ppo", "gppo"):
        record = last_evaluated(output / "runs" / f"{label}-seed0" / "samples.jsonl")
        assert record["step"] == 3
        correct = sum(sample["correct"] for sample in record["samples"])
        verdict = "correct" if record["samples"][0]["correct"] else "wrong"
        heading = f"{label} (seed 0, step 3), {verdict} ({correct} of {len(record['samples'])} samples correct):"
        assert heading in answers and record["samples"][0]["text"] in answers
    assert answers.index("\nppo (seed 0") < answers.index("\ngppo (seed 0")  # in the order of the labels


def test_no_answers_section_without_kept_answers(tmp_path):
    runs = [Run("ppo", "ppo", 0, directory=tmp_path / "ppo-seed0")]
    assert answers_section(["ppo"], runs) == [] == answers_section(["ppo"], [])
