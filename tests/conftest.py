"""Test tiers: every test is marked ``unit`` except those of the modules in ``END_TO_END``, the tests named in
``END_TO_END_TESTS`` and the ``slow`` and ``gpu`` ones, so ``pytest -m unit`` runs the fast in-process tests only
(no subprocess, no command, no second process). The default run keeps the whole suite. A new module that starts a
process (a command, a sandbox, the math checker, a worker pool, a second rank) goes in ``END_TO_END``; a new such
test of a mostly in-process module goes in ``END_TO_END_TESTS``."""

from pathlib import Path

import pytest

import klear  # noqa: F401  (sets MKL_CBWR before any test computes, as every command does)

TESTS = Path(__file__).parent

# Module (relative to tests/) -> why it is not a unit test.
END_TO_END: dict[str, str] = {
    "test_bad_input.py": "runs the commands with bad input in subprocesses",
    "test_cli.py": "runs the installed `klear` script and `python -m` in subprocesses",
    "test_commands.py": "runs every documented command in a subprocess",
    "test_console.py": "runs `python -m klear.fit` in subprocesses",
    "test_docs.py": "runs the docs' snippets in subprocesses",
    "test_user_errors.py": "runs the commands with bad input in subprocesses",
    "compare/test_compare.py": "runs `klear.compare` main() (whole training runs)",
    "config/test_config.py": "runs `python -m klear.fit` in a subprocess",
    "config/test_help.py": "runs `--help-config` in a subprocess",
    "config/test_preflight.py": "runs `klear.fit` main() and a subprocess",
    "eval/test_command.py": "runs `python -m klear.eval` in subprocesses",
    "eval/test_completions.py": "runs `klear.eval` main() and `python -m klear.eval` in a subprocess",
    "eval/test_eval.py": "runs `klear.eval` main()",
    "data/test_published_rows.py": "runs `klear.eval` main()",
    "data/test_rllm_code_files.py": "runs programs in the sandbox, `klear.data show` and `klear.eval` in subprocesses",
    "prep/test_code_tests.py": "runs `klear.data` main()",
    "prep/test_command_files.py": "runs `python -m klear.data` in subprocesses",
    "prep/test_curate.py": "runs `klear.data` main() and a subprocess",
    "prep/test_data_cli.py": "runs `klear.data` main()",
    "prep/test_decontaminate.py": "runs `klear.data` main()",
    "prep/test_dedup.py": "runs `klear.data` main()",
    "prep/test_mixing.py": "runs `klear.data` main()",
    "prep/test_show.py": "runs `python -m klear.data show` in subprocesses",
    "rewards/test_code_budget.py": "runs programs in sandbox subprocesses, in a worker pool",
    "rewards/test_code_checks.py": "runs programs in sandbox subprocesses",
    "rewards/test_code_reward.py": "runs programs in sandbox subprocesses",
    "rewards/test_code_suites.py": "runs programs and pytest files in sandbox subprocesses",
    "rewards/test_math_reward.py": "scores through the math checker, a subprocess",
    "rewards/test_math_timeouts.py": "starts a multiprocessing pool",
    "rewards/test_pool.py": "starts reward worker processes",
    "rewards/test_sandbox.py": "starts sandbox subprocesses",
    "rewards/test_sandbox_attacks.py": "runs hostile programs that fork in the sandbox",
    "rollout/test_hf_engine.py": "runs two gloo ranks in a subprocess",
    "rollout/test_vllm_engine.py": "runs `klear.fit` main() (whole training runs)",
    "rollout/test_vllm_ranks.py": "runs two ranks of the CLI in subprocesses",
    "runtime/test_memory.py": "measures memory in fresh subprocesses",
    "run/test_divergence.py": "runs `python -m klear.fit` until it diverges, in subprocesses (two ranks too)",
    "run/test_loading_stop.py": "signals `python -m klear.fit` in subprocesses while they load",
    "run/test_progress.py": "runs `python -m klear.fit` in a subprocess",
    "run/test_report.py": "runs `klear.fit` main() (a training run)",
    "run/test_one_writer.py": "runs two commands on one output in subprocesses, and kills one",
    "run/test_resume_checks.py": "resumes runs in subprocesses",
    "run/test_stopping.py": "stops real runs started in subprocesses",
    "runtime/test_threads.py": "starts a busy process and the commands in subprocesses",
    "runtime/test_vocab_shards.py": "runs two gloo ranks in a subprocess",
    "run/test_write_failures.py": "runs `python -m klear.fit` in subprocesses, on one and two ranks",
    "experience/test_async_rollouts.py": "runs the CLI in subprocesses and rollout worker processes",
    "stages/test_determinism.py": "runs `python -m klear.fit` in subprocesses",
    "stages/test_embedded_default.py": "runs `klear.fit` main() (whole training runs)",
    "stages/test_fsdp2.py": "runs two ranks of the CLI in subprocesses",
    "stages/test_real_width.py": "runs the CLI in a subprocess",
    "stages/test_rl_end_to_end.py": "runs `klear.fit` main() and a subprocess",
    "stages/test_sft_end_to_end.py": "runs `klear.fit` main() (whole training runs)",
    "tools/test_bench_async.py": "runs a benchmark script in a subprocess",
    "tools/test_bench_contention.py": "runs a benchmark script in a subprocess",
    "tools/test_bench_reproducible.py": "runs a benchmark script in subprocesses",
    "tools/test_bench_memory.py": "runs a benchmark script in a subprocess",
    "tools/test_bench_rl_packing.py": "runs a benchmark script in a subprocess",
    "tools/test_bench_sft_step.py": "runs a benchmark script in a subprocess (which starts klear's side in another)",
    "tools/test_plot_staleness.py": "runs a plotting script in a subprocess",
}

# Modules that mix both: module -> the tests (by name, or by name with parameters) that start a process.
END_TO_END_TESTS: dict[str, set[str]] = {
    # The code reward runs each program in a sandbox subprocess.
    "data/test_code_formats.py": {
        "test_humaneval_tests_score_with_the_code_reward",
        "test_lcb_converted_tests_score_with_the_code_reward",
        "test_mbpp_tests_score_with_the_code_reward",
    },
    "data/test_synthetic_code.py": {"test_reference_programs_pass_their_tests_and_labelled_output_fails_them"},
    "models/test_models.py": {"test_shipped_checkpoint_solves_held_out_problems"},
    "rewards/test_reward_contract.py": {"test_an_empty_box_never_matches", "test_bytes_are_decoded"},
    # The math checker runs in a subprocess (and the code reward in the sandbox's).
    "rewards/test_correctness.py": {
        "test_code_is_correct_when_every_test_passes",
        "test_math_is_correct_on_an_equivalent_answer_whatever_its_scores",
        "test_math_is_correct_through_the_checker_and_not_after_a_timeout",
    },
    # The math checker, in this process and in a worker process; a fresh interpreter for what the import loads.
    "rewards/test_scorer.py": {
        "test_score_gives_raw_shaped_correct_and_counts",
        "test_importing_the_scorer_imports_neither_torch_nor_omegaconf",
    },
    # A short RL run through `klear.fit` main(), and the refusal of the command in a fresh interpreter.
    "update/test_erc_run.py": {
        "test_a_short_dapo_erc_run_logs_its_entropy_band",
        "test_erc_without_the_trainers_old_logprobs_is_one_line_before_heavy_imports",
    },
}


def is_unit(item: pytest.Item, module: str) -> bool:
    names = {item.name, getattr(item, "originalname", item.name)}
    if item.get_closest_marker("end_to_end") is not None:
        return False
    if module in END_TO_END or names & END_TO_END_TESTS.get(module, set()):
        return False
    # A slow or GPU test is never unit, so `-m unit` (which replaces the default `-m`) still leaves them out.
    return item.get_closest_marker("slow") is None and item.get_closest_marker("gpu") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A renamed or deleted module would otherwise silently turn the list stale.
    missing = [module for module in [*END_TO_END, *END_TO_END_TESTS] if not (TESTS / module).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: END_TO_END names missing modules {missing}; remove or rename them")
    for item in items:
        if is_unit(item, item.path.relative_to(TESTS).as_posix()):
            item.add_marker(pytest.mark.unit)
