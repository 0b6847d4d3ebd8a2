"""An objective that fails on one rank (the only one, in one process), for `test_rank_failure_runs` and
`test_out_of_memory`: PPO's, until its ``FAIL_AT``-th surrogate on the rank whose ``LOCAL_RANK`` (0 without one) is
``FAIL_RANK``, which then, by ``FAIL_HOW``:

- ``raise``: raises ``RuntimeError("boom on rank R")``;
- ``linger``: raises it, and its process then stays alive for ten minutes after its traceback (an ``atexit`` sleep),
  holding its connections open, so the other ranks stay blocked in their collective as ranks blocked in an NCCL
  collective do whatever their peer did;
- ``kill``: ends its own process with SIGKILL, as the out-of-memory killer does;
- ``allocate``: asks the CPU allocator for a petabyte, which it refuses (``RuntimeError: ... can't allocate
  memory``), as an allocation past a device's memory is refused;
- ``start``: the module cannot be imported there, so that rank's config does not load (exit status 2) while rank 0
  waits for it to join the process group.

``FAIL_GRACE_S`` sets `klear.run.rank_failure.GRACE_S` in every rank (the module is imported by each).
`allocating_engine` builds the ``hf`` engine whose sampling asks the CPU allocator for a petabyte, inside the
engine's own ``rollout`` phase: a run or command out of memory while it samples."""

from __future__ import annotations

import atexit
import os
import signal
import time

import torch

from klear.objectives.ppo import PPOClip
from klear.rollout.hf import HFEngine, build_hf_engine
from klear.run import rank_failure

if os.environ.get("FAIL_HOW") == "start" and os.environ.get("LOCAL_RANK") == os.environ.get("FAIL_RANK"):
    raise ImportError(f"rank {os.environ['LOCAL_RANK']} cannot start")
if "FAIL_GRACE_S" in os.environ:
    rank_failure.GRACE_S = float(os.environ["FAIL_GRACE_S"])


class FailingPPO(PPOClip):
    calls = 0

    def surrogate(self, ratio, advantages):
        FailingPPO.calls += 1
        rank = os.environ.get("LOCAL_RANK", "0")
        if rank == os.environ.get("FAIL_RANK") and FailingPPO.calls >= int(os.environ.get("FAIL_AT", "1")):
            how = os.environ.get("FAIL_HOW", "raise")
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "allocate":
                torch.empty(10**15, dtype=torch.uint8)
            if how == "linger":
                atexit.register(time.sleep, 600)
            raise RuntimeError(f"boom on rank {rank}")
        return super().surrogate(ratio, advantages)


class AllocatingEngine(HFEngine):
    def _generate_batch(self, jobs, sampling):
        torch.empty(10**15, dtype=torch.uint8)


def allocating_engine(*args, **kwargs) -> AllocatingEngine:
    """As `build_hf_engine`, an `AllocatingEngine`."""
    engine = build_hf_engine(*args, **kwargs)
    engine.__class__ = AllocatingEngine
    return engine
