"""Objectives head-to-head: the ``python -m klear.compare`` command (`klear.compare.cli`), its runs
(`klear.compare.runs`) and reports (`klear.compare.report`, with the statistics of `klear.eval.stats`)."""
