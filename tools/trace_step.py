"""Which of klear's source files one synchronous RL step runs through, and how often it comes back to one.

Runs the short RL run of the test suite (tiny model, 4 prompts x 4 samples, ``rollout.old_logprobs=trainer``,
``algorithm.tis_cap=2``, KL and SFT terms on) in this process and profiles step 1 (an update step with no
evaluation due), from the first ``on_train_batch_start`` hook to the last ``on_train_batch_end`` hook, the engine
refresh included.

How it counts: at every function call and return it takes the *active file*, the source file of the innermost
frame that belongs to ``src/klear`` (torch, transformers and Lightning frames are skipped: a klear function called
back by Lightning counts, Lightning does not). Each change of the active file is a *transition* ``A -> B``. Loops
repeat transitions (one per micro-batch, per sample), so each distinct transition counts once:

- ``files``: the distinct klear files the step runs code of;
- ``transitions``: the distinct ``A -> B`` pairs;
- ``returns``: the distinct transitions into a file that was active before and left (``A -> B`` where ``B`` had
  been active before the step reached ``A``), the re-entries that make a step hard to read top to bottom;
- ``entries``: the distinct ``(A, B, function)`` calls from file ``A`` into a function of file ``B``: how many
  doors each file is entered by (``rl.py`` calling four functions of ``update.py`` is four);
- per file, the distinct files it was re-entered from.

    python tools/trace_step.py [--files] [--doc | --check]

``--files`` prints the files in the order the step first enters them. ``--doc`` writes the summary (the four counts
and the files in order) into the marked block of ``docs/architecture.md`` ("One step, file by file"); ``--check``
compares that block with what the step does now and exits with status 1, in one line, when they differ
(``tests/tools/test_trace_step.py`` runs it, so a change in the step's files shows up in review).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
# This checkout's package before any installed one: the trace counts frames by their path under it.
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
PACKAGE = str(ROOT / "src" / "klear") + os.sep
TRACED_STEP = 1
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- trace_step -->", "<!-- /trace_step -->"
"""The markers of the block ``--doc`` writes and ``--check`` reads."""

from tests.runs import RL_SHORT  # noqa: E402  (after the path above)

RUN = [
    *RL_SHORT,
    "trainer.max_steps=2",
    "trainer.checkpoint_every_n_steps=10",
    "eval.every_n_steps=0",
    "rollout.old_logprobs=trainer",
    "algorithm.tis_cap=2",
    "algorithm.kl_coef=0.01",
    "algorithm.sft_alpha=0.1",
]
"""The test suite's short RL run (later overrides win), with every optional term of the update on."""


class Trace:
    """The active-file transitions of the calls and returns seen while installed (see the module docstring)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.transitions: list[tuple[str, str]] = []
        self.seen_transitions: set[tuple[str, str]] = set()
        self.active: str | None = None
        self.entries: set[tuple[str, str, str]] = set()

    def __call__(self, frame, event, arg) -> None:
        if event not in ("call", "return"):
            return
        if event == "return":
            frame = frame.f_back
        while frame is not None and not frame.f_code.co_filename.startswith(PACKAGE):
            frame = frame.f_back
        if frame is None:
            return
        name = frame.f_code.co_filename[len(PACKAGE) :]
        if name == self.active:
            return
        if event == "call" and self.active is not None:
            self.entries.add((self.active, name, frame.f_code.co_qualname))
        if name not in self.order:
            self.order.append(name)
        if self.active is not None and (self.active, name) not in self.seen_transitions:
            self.seen_transitions.add((self.active, name))
            self.transitions.append((self.active, name))
        self.active = name

    def returns(self) -> list[tuple[str, str]]:
        """Distinct transitions into a file first entered before the file they come from."""
        first = {name: index for index, name in enumerate(self.order)}
        return [(a, b) for a, b in self.transitions if first[b] < first[a]]


def traced_step() -> Trace:
    """The trace of step `TRACED_STEP` of the short run `RUN`."""
    import lightning as L

    from klear.config.load import load_config
    from klear.fit import build_stage, build_trainer, prepare_run_dir

    trace = Trace()

    class Start(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == TRACED_STEP:
                sys.setprofile(trace)

    class Stop(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == TRACED_STEP:
                sys.setprofile(None)

    with tempfile.TemporaryDirectory() as out:
        config = load_config(str(ROOT / "configs" / "rl.yaml"), [*RUN, f"output_dir={out}"])
        run_dir = prepare_run_dir(config, resume=False, overwrite=False)
        module, batches = build_stage(config, run_dir)
        trainer = build_trainer(config, run_dir, False, [Start(), Stop()])
        trainer.fit(module, batches)
    return trace


def counts(trace: Trace) -> str:
    """The summary line: files, transitions, returns and entries."""
    return (
        f"one synchronous step: {len(trace.order)} files, {len(trace.transitions)} transitions, "
        f"{len(trace.returns())} returns, {len(trace.entries)} entries"
    )


def summary(trace: Trace) -> str:
    """What the doc's block holds: the counts, then the files in the order the step first enters them."""
    return "\n".join([counts(trace), "", *trace.order])


def block(text: str) -> str:
    """The summary between the markers of ``text`` (a fenced ``text`` block between `BEGIN` and `END`)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"error: {DOC.name} needs one {BEGIN} ... {END} block (python tools/trace_step.py --doc)")
    inner = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    return inner.removeprefix("```text").removesuffix("```").strip()


def with_block(text: str, summary: str) -> str:
    """``text`` with its block replaced by ``summary``."""
    block(text)  # exactly one block
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n```text\n{summary}\n```\n{END}{tail}"


def difference(documented: str, summary: str) -> str | None:
    """``None`` when the doc's block is ``summary``; else the one line that says how they differ."""
    if documented == summary:
        return None
    was, now = documented.splitlines(), summary.splitlines()
    if was[:1] != now[:1]:
        said = was[0].removeprefix("one synchronous step: ") if was else "nothing"
        return f"{DOC.name} says {said}; {now[0]}: run python tools/trace_step.py --doc"
    added = [name for name in now[2:] if name not in was[2:]]
    gone = [name for name in was[2:] if name not in now[2:]]
    change = f"entered now: {added}, no longer: {gone}" if added or gone else "the files are entered in another order"
    return f"{DOC.name}'s files differ from the step's ({change}): run python tools/trace_step.py --doc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="print the files in the order the step enters them")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--doc", action="store_true", help=f"write the summary into {DOC.relative_to(ROOT)}")
    action.add_argument("--check", action="store_true", help=f"exit 1 when {DOC.relative_to(ROOT)} differs")
    args = parser.parse_args()
    trace = traced_step()
    returns = trace.returns()
    if args.files:
        print("\n".join(trace.order))
    back: dict[str, list[str]] = {}
    for source, target in returns:
        back.setdefault(target, []).append(source)
    for target, sources in sorted(back.items(), key=lambda item: -len(item[1])):
        print(f"{target}: re-entered from {len(sources)} ({', '.join(sorted(sources))})")
    doors: dict[tuple[str, str], int] = {}
    for source, target, _ in trace.entries:
        doors[source, target] = doors.get((source, target), 0) + 1
    for (source, target), count in sorted(doors.items(), key=lambda item: -item[1])[:8]:
        print(f"{source} -> {target}: {count} functions")
    print(counts(trace))
    if args.doc:
        DOC.write_text(with_block(DOC.read_text(), summary(trace)))
        print(f"written to {DOC.relative_to(ROOT)}")
    elif args.check and (message := difference(block(DOC.read_text()), summary(trace))) is not None:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
