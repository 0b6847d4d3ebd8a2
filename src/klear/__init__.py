"""klear: Lightning-native post-training of reasoning language models.

Long chain-of-thought SFT, then reinforcement learning with verifiable rewards, with the policy objective
(PPO clip, DAPO clip-higher, CISPO, GPPO, GSPO, or a user's subclass) chosen by name.

Importing klear asks Intel MKL (the matrix products of torch's x86 CPU builds) for results that do not depend on
the thread count, ``MKL_CBWR=AUTO,STRICT``, unless ``MKL_CBWR`` is already set: MKL reads it at its first call, so
every command (and every process a command starts, which inherits it) computes the same numbers at any thread
count, and klear may follow the machine's load when it chooses its threads (`klear.runtime.threads`,
docs/performance.md#cpu-threads). A Python caller who computes with torch before importing klear sets it first.
"""

import os

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
