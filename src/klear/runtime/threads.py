"""How many CPU threads torch computes with: one policy for every command, applied where the model is loaded.

`klear.models.load_model` calls `configure` once the model's size is known, so ``klear.fit`` (both stages),
``klear.eval``, ``klear.data curate`` and the rollout worker all pass through it. In order:

1. ``OMP_NUM_THREADS`` in the environment wins (torch reads it at start-up; the line says so, and that a requested
   count is ignored), unless klear itself set it for the ranks of a multi-process run (see below);
2. a count the caller set with ``torch.set_num_threads`` before, in the same process (Python API use), is kept;
3. a requested count (``trainer.cpu_threads``, ``--threads``) > 0 is used as it is;
4. ``0`` (auto): the cores this process may use (``os.sched_getaffinity``, capped by the cgroup CPU quota in
   ``cpu.max`` or ``cpu.cfs_quota_us``), minus the cores other processes keep busy right now (sampled from
   ``/proc/stat`` over `SAMPLE_S`, this process's own CPU time left out; elsewhere the 1-minute load average),
   shared among the run's processes on this machine, at least 1 and at most one thread per
   `PARAMETERS_PER_THREAD` parameters (never fewer than 2).

Why: a parallel op waits for its slowest thread. On a core another process also wants, each thread runs only
every few milliseconds, and a small model's step is thousands of short ops, so a run with a thread per core
beside busy processes became 5-25x slower instead of about 2x (docs/performance.md, `tools/bench_contention.py`).
The interop pool gets the same count; torch allows that only once per process, before parallel work.

The count does not change the numbers: a seeded run gives the same metrics at 1 and at 2 threads, so following
the load costs no repeatability (`tests/stages/test_determinism.py`). The one kernel that summed in an order set
by the thread count, PyTorch's CPU attention for a decoding step, is replaced by `klear.models.attention`.

A multi-process CPU run (``trainer.devices`` > 1) chooses once, in the process that starts the others, and hands
its count to them through ``OMP_NUM_THREADS`` (Lightning's launcher would otherwise set its own count after
klear's line was logged): each rank computes with the count the line names.

The choice is made once per process and request: a later `configure` with the same request keeps it (and logs
nothing), so reloading a model never re-samples the load. One INFO line says what was chosen and why; `current`
returns it for the run's ``report.md`` and ``summary.json``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SAMPLE_S = 0.2
"""How long the CPU use of other processes is sampled before an automatic choice (seconds)."""
PARAMETERS_PER_THREAD = 100_000
"""Parameters per thread beyond 2 threads: the tiny model's 128-wide matrices give a third thread little work."""
CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
HANDED_DOWN = "KLEAR_CPU_THREADS"
"""Set beside ``OMP_NUM_THREADS`` by the process that starts a multi-process run: ``<count> <reason>``."""


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    """torch's intra-op threads (and MKL's)."""
    cores: int
    """The cores this process may use (affinity and cgroup quota)."""
    reason: str

    def line(self) -> str:
        return f"CPU threads: {self.threads} of {self.cores} cores ({self.reason})"

    def record(self) -> dict[str, object]:
        """As ``report.md`` and ``summary.json`` record it."""
        return {"threads": self.threads, "cores": self.cores, "reason": self.reason}


_state: dict[str, object] = {"request": None, "applied": None, "choice": None}
"""The last request `configure` served, the thread count it applied and the choice it logged (None: never)."""


def current() -> ThreadChoice | None:
    """The thread count this process computes with and why, as last logged (None before any model was loaded)."""
    choice = _state["choice"]
    if choice is not None and choice.threads != torch.get_num_threads():
        return ThreadChoice(
            torch.get_num_threads(), choice.cores, f"set by torch.set_num_threads after: {choice.reason}"
        )
    return choice


def recorded() -> dict[str, object] | None:
    """`current` as a run's ``summary.json`` records it (None before any model was loaded)."""
    choice = current()
    return None if choice is None else choice.record()


def startup_threads() -> int:
    """torch's thread count in a process nobody changed it in: OpenMP's default, one per CPU of the affinity mask."""
    return len(os.sched_getaffinity(0)) if sys.platform.startswith("linux") else os.cpu_count() or 1


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask, capped by its cgroup's CPU quota."""
    cores = startup_threads()
    quota = cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_quota() -> float | None:
    """The cgroup's CPU quota in cores (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us`` of v1), None when unlimited."""
    if CGROUP_V2.is_file():
        quota, period = CGROUP_V2.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    if CGROUP_V1[0].is_file() and CGROUP_V1[1].is_file():
        quota, period = (int(path.read_text()) for path in CGROUP_V1)
        return None if quota <= 0 else quota / period
    return None


def busy_cores(seconds: float = SAMPLE_S) -> float:
    """How many of this process's cores other processes keep busy now: their share of ``/proc/stat``'s busy time
    over ``seconds``, minus this process's own CPU time; off Linux, the 1-minute load average minus this one."""
    if not Path("/proc/stat").is_file():
        return max(0.0, os.getloadavg()[0] - 1.0)
    cpus = {f"cpu{index}" for index in os.sched_getaffinity(0)}
    before, own_before, started = _busy_ticks(cpus), time.process_time(), time.monotonic()
    time.sleep(seconds)
    busy = (_busy_ticks(cpus) - before) / os.sysconf("SC_CLK_TCK")
    own = time.process_time() - own_before
    return min(float(len(cpus)), max(0.0, (busy - own) / (time.monotonic() - started)))


def _busy_ticks(cpus: set[str]) -> int:
    total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] in cpus:
            ticks = [int(value) for value in fields[1:8]]  # user nice system idle iowait irq softirq
            total += sum(ticks) - ticks[3] - ticks[4]
    return total


def choose(requested: int, parameters: int, processes: int = 1) -> ThreadChoice:
    """The thread count for a model of ``parameters`` given ``requested`` (0: auto), for each of ``processes`` that
    the run starts on this machine; see the module docstring."""
    if requested < 0:
        raise ValueError(f"CPU threads must be >= 0 (0: chosen by klear), got {requested}")
    cores = usable_cores()
    ignored = f"; the requested {requested} is ignored" if requested else ""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    handed, _, why = os.environ.get(HANDED_DOWN, "").partition(" ")
    if value and handed == value:
        return ThreadChoice(int(value), cores, f"chosen by the process that started this rank: {why}")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"OMP_NUM_THREADS must be a whole number >= 1, got {value!r}: fix or unset it")
        return ThreadChoice(int(value), cores, f"OMP_NUM_THREADS={value} set in the environment{ignored}")
    set_before = torch.get_num_threads()
    if set_before not in (startup_threads(), _state["applied"]):
        return ThreadChoice(set_before, cores, f"set by torch.set_num_threads before{ignored}")
    if requested:
        return ThreadChoice(requested, cores, "as requested")
    busy = busy_cores()
    cap = max(2, parameters // PARAMETERS_PER_THREAD)
    threads = max(1, min(cap, math.floor((cores - busy) / processes + 0.5)))
    why = f"auto: {busy:.1f} of them busy with other processes, {parameters / 1e6:.2f}M parameters"
    why += f", {processes} processes of this run" if processes > 1 else ""
    return ThreadChoice(threads, cores, why + (f" (at most {cap} threads)" if threads == cap < cores else ""))


def configure(requested: int, parameters: int, processes: int = 1) -> ThreadChoice | None:
    """Choose and apply the thread count (see `choose`) and log it; None when this request was already served, or
    when this process computes with a `share` (a rollout worker), which stands. With ``processes`` > 1 (the ranks
    a multi-process CPU run starts on this machine) the count is each rank's and is handed down to the ranks."""
    served = _state["request"] == requested or _state["request"] == "share"
    if served and torch.get_num_threads() == _state["applied"]:
        return None
    choice = choose(requested, parameters, processes)
    apply(choice)
    _state["request"] = requested
    if processes > 1 and not os.environ.get("OMP_NUM_THREADS", "").strip():
        os.environ["OMP_NUM_THREADS"] = str(choice.threads)  # the ranks started from here inherit both
        os.environ[HANDED_DOWN] = f"{choice.threads} {choice.reason}"
    return choice


def apply(choice: ThreadChoice) -> None:
    """Set torch's threads to ``choice`` (and the interop pool's, when this process still allows it); log it."""
    torch.set_num_threads(choice.threads)
    _state["applied"], _state["choice"] = choice.threads, choice
    note = ""
    if torch.get_num_interop_threads() != choice.threads:
        try:
            torch.set_num_interop_threads(choice.threads)
        except RuntimeError:  # set before, or parallel work has started: torch allows it once per process
            note = f"; interop threads stay {torch.get_num_interop_threads()}"
    log.info("%s%s", choice.line(), note)


def share(threads: int, cores: int, reason: str) -> None:
    """Apply a count klear derived from an earlier choice (the rollout worker's and the trainer's halves)."""
    apply(ThreadChoice(threads, cores, reason))
    _state["request"] = "share"
