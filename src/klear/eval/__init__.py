"""Evaluation: the ``python -m klear.eval`` command (`klear.eval.cli`), accuracy during training
(`klear.eval.in_training`), the estimators and reports (`klear.eval.metrics`: avg@k, unbiased pass@k), and what the
command shares with ``klear.data curate``: the problem loader with its task choice and reference checks
(`klear.eval.tasks`), the sampling engine (`klear.eval.sampler`) and the options both read once from their command
lines (`klear.eval.options`). Samples are drawn and scored by `klear.rollout.sample_and_score`. A sample is correct
when its reward says so (`klear.rewards.RewardOutcome.correct`)."""
