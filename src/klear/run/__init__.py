"""A run's directory and what it leaves there: the directory and its checks (`directory`), checkpoints
(`checkpoints`), ``metrics.csv`` (`metrics_log`), ``report.md`` and ``curves.png`` (`report`), the progress bar and
console lines (`progress`, `console`), the checks made before a run directory is written (`preflight`) and the
SIGTERM stop every rank agrees on (`stopping`)."""
