"""Rollout engines, by name from one registry (`klear.rollout.engine.ENGINES`): ``hf`` (`hf`, transformers with
a KV cache, any device) and ``vllm`` (`vllm_engine`, with its upstream internals in `vllm_compat`), and the
callback that refreshes the engine's weights in place after every update (`refresh`)."""
