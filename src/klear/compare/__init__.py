"""Objectives head-to-head: the ``python -m klear.compare`` command (`klear.compare.cli`), its runs
(`klear.compare.runs`), reports (`klear.compare.report`) and statistics (`klear.compare.stats`)."""
