"""Data preparation, the ``python -m klear.data COMMAND`` commands (`klear.prep.cli`): ``synthetic``, ``mix``,
``dedup``, ``decontaminate``, ``filter-tests`` (`code_tests`) and ``curate`` (pass rates of a model), with the
row files they read and write (`rowfiles`) and their helpers (`mixing`, `ngrams`, `pass_rates`)."""
