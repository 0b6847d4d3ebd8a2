"""A memory timeline of a run: resident memory sampled with the phase of the run it falls in.

Off (every call returns at once) unless ``KLEAR_MEMORY_TIMELINE`` names a directory; ``tools/bench_memory.py`` sets
it. Then each process of the run that marks a phase (every rank Lightning starts inherits the variable) samples its
resident set size every 10 ms in a daemon thread, and at exit writes ``<dir>/rank<LOCAL_RANK>-<pid>.tsv``: one line
per sample (seconds, phase, ``VmRSS`` bytes), then a ``peak`` line with ``VmHWM``, the kernel's exact high-water mark
(which sampling alone can miss), and the phase during which it last rose.

Phases are marked where they start (:func:`mark`: ``load``, ``setup``, ``update``, ...) or wrap a call and give the
previous phase back after it (:func:`phase`: ``rollout`` inside ``update`` or ``eval``, shown as ``eval/rollout``).
Linux only: it reads ``/proc/self/status``. The phase itself is kept with the timeline off too (:func:`current_phase`,
:func:`raised_in`): a run that runs out of memory says where (`klear.run.out_of_memory`).

:func:`release_freed_memory` is not part of the timeline: it hands memory that was freed back to the operating
system, which glibc's allocator does not do by itself for blocks under its mmap threshold (the threshold rises to
32 MB once a large block is freed, so most weight matrices of a real model come from its heaps).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import functools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ENV = "KLEAR_MEMORY_TIMELINE"
INTERVAL_S = 0.01
PHASE_ATTRIBUTE = "klear_phase"
"""The attribute of an exception that names the phase it was raised in (:func:`raised_in`)."""

_timeline: _Timeline | None = None
_current = ""


def mark(label: str) -> None:
    """The run enters phase ``label`` (until the next mark)."""
    global _current
    _current = label
    timeline = _get()
    if timeline is not None:
        timeline.enter(label)


@contextlib.contextmanager
def phase(label: str) -> Iterator[None]:
    """Phase ``label`` nested in the current one for the duration of the block. An exception raised inside carries
    the innermost phase it was raised in (`raised_in`), read once the blocks it left have given theirs back."""
    global _current
    outer = _current
    _current = f"{outer}/{label}" if outer else label
    timeline = _get()
    if timeline is not None:
        timeline.enter(_current)
    try:
        yield
    except BaseException as error:
        if not hasattr(error, PHASE_ATTRIBUTE):
            with contextlib.suppress(AttributeError, TypeError):  # an exception that takes no attribute
                setattr(error, PHASE_ATTRIBUTE, _current)
        raise
    finally:
        _current = outer
        if timeline is not None:
            timeline.enter(outer)


def current_phase() -> str:
    """The phase the run is in (``""`` before the first mark), kept whether or not the timeline is on."""
    return _current


def raised_in(error: BaseException) -> str:
    """The phase ``error`` was raised in: the innermost :func:`phase` block it left, else the phase marked now."""
    return getattr(error, PHASE_ATTRIBUTE, _current)


def watch_optimizer(optimizer) -> None:
    """Mark ``optimizer`` steps as the ``optimizer`` phase (back to ``update`` after each), when the timeline is on."""
    if _get() is not None:
        optimizer.register_step_pre_hook(lambda *_: mark("optimizer"))
        optimizer.register_step_post_hook(lambda *_: mark("update"))


def release_freed_memory() -> None:
    """Return the free pages of the C heap to the operating system (glibc's ``malloc_trim``; other C libraries
    have no such call, and nothing is done)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    library = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None


def status_bytes(field: str) -> int:
    """``VmRSS``, ``VmHWM``, ... of this process from ``/proc/self/status``, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(f"/proc/self/status has no {field}")


def _get() -> _Timeline | None:
    global _timeline
    if _timeline is None and os.environ.get(ENV):
        _timeline = _Timeline(Path(os.environ[ENV]))
    return _timeline


class _Timeline:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.label = ""
        self.start = time.monotonic()
        self.samples: list[tuple[float, str, int]] = []
        self.peak, self.peak_label = 0, ""
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=self._sample_forever, name="klear-memory", daemon=True).start()
        atexit.register(self.write)

    def enter(self, label: str) -> None:
        with self.lock:
            self._sample()  # the phase that ends gets its last sample, and its share of the peak
            self.label = label
            self._sample()

    def _sample(self) -> None:
        rss, peak = status_bytes("VmRSS"), status_bytes("VmHWM")
        if peak > self.peak:
            self.peak, self.peak_label = peak, self.label
        self.samples.append((time.monotonic() - self.start, self.label, rss))

    def _sample_forever(self) -> None:
        while not self.done.wait(INTERVAL_S):
            with self.lock:
                self._sample()

    def write(self) -> None:
        self.done.set()
        with self.lock:
            self._sample()
            self.directory.mkdir(parents=True, exist_ok=True)
            rank = os.environ.get("LOCAL_RANK", "0")
            lines = [f"{seconds:.3f}\t{label}\t{rss}" for seconds, label, rss in self.samples]
            lines.append(f"peak\t{self.peak_label}\t{self.peak}")
            (self.directory / f"rank{rank}-{os.getpid()}.tsv").write_text("\n".join(lines) + "\n")
