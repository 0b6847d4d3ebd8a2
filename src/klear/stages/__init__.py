"""The training stages, as LightningModules: what both share (`base`), SFT (`sft`) and RL (`rl`, read top to
bottom: rollouts, advantages, update, evaluation, log). The RL step's parts live in their own folders:
`klear.experience` (rollouts), `klear.update` (the policy update) and `klear.kernels` (tensors and log-probs)."""
