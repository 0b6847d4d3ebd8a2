"""A run's directory and what it leaves there: the directory and its checks (`directory`), checkpoints
(`checkpoints`), ``metrics.csv`` (`metrics_log`), ``report.md`` and ``curves.png`` (`report`), the progress bar and
console lines (`progress`, `console`), the checks made before a run directory is written (`preflight`), the
SIGTERM or SIGHUP stop every rank agrees on (`stopping`; before the fit and in the other commands, `loading_stop`), the
lock that keeps a second writer out of an output (`folder_lock`), the processes that die with the one that
started them (`parent_death`), a rank that fails alone, which stops every rank and is named by rank 0
(`rank_failure`), and a run out of memory, told in one line with what to lower (`out_of_memory`)."""
