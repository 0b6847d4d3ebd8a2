"""What runs a stage: devices (`device`), distributed helpers and strategies (`distributed`, `strategies`), the
run directory (`run_dir`), checkpoints and the metrics log (`checkpoints`, `metrics_log`), the optimizer and
schedule (`optim`), and the one place that touches Lightning internals (`lightning_compat`)."""
