"""Objectives head-to-head: the ``python -m klear.compare`` command (`klear.compare.cli`), its runs
(`klear.compare.runs`), reports (`klear.compare.report`) and statistics (`klear.compare.stats`)."""

from klear._moved import moved_attribute


def __getattr__(name: str):
    return moved_attribute(__name__, name)  # the names of the klear 0.1 module `klear.compare`, deprecated
