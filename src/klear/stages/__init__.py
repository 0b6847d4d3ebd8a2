"""The training stages, as LightningModules: what both share (`base`), SFT (`sft`) and RL (`rl`, read top to
bottom: rollout, reward, advantages, update), with the RL pieces beside it — advantage estimators
(`advantages`), rollouts as padded tensors (`rollout_batch`), trainer log-probs (`logprobs`) and one optimizer
update of the policy (`update`)."""
