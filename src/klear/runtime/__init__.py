"""What runs the computation: devices and precision (`device`), distributed helpers and strategies
(`distributed`, `strategies`), the vocabulary-sharded embedding and head (`vocab_shards`), memory accounting
(`memory`), the optimizer and schedule (`optim`), CPU threads (`threads`), access to the Hugging Face Hub
(`hub`), the terminal and the stop signals a process group shares (`terminal`), the step's metric reductions
(`step_metrics`) and the one place that touches Lightning internals (`lightning_compat`). A run's directory and
outputs are in `klear.run`."""
