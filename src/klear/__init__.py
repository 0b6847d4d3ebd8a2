"""klear: Lightning-native post-training of reasoning language models.

Long chain-of-thought SFT, then reinforcement learning with verifiable rewards, with the policy objective
(PPO clip, DAPO clip-higher, CISPO, GPPO, GSPO, or a user's subclass) chosen by name.
"""

__version__ = "0.1.0"
