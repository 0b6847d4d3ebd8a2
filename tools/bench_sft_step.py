"""One SFT step of klear vs one step of TRL's SFTTrainer on the same long-CoT data, on CPU, each side in a process.

The data: single-turn conversations in the ``messages`` layout whose assistant turn is a chain of thought inside
``<think>...</think>`` (a chain of arithmetic steps, written out one line each) and a boxed answer. Their lengths
are long-tailed (log-normal, median about a third of ``--max-length``, every one at most ``--max-length`` tokens),
so several short conversations share a packed row while the long ones fill most of one. The rows are written to a
jsonl file that both sides read. Matched:

- model: the same weights, loaded by each side from the same folder: the built-in tiny Qwen3 (``tiny-sft``), or
  with ``--shape qwen3-0.6b`` a randomly initialised Qwen3-0.6B-shaped model with ``--layers`` decoder layers
  (hidden 1024, 16 query / 8 KV heads of 128, intermediate 3072, vocabulary 151,936, tied embeddings) built once
  with :func:`klear.models.tiny.build_tiny` next to the tiny tokenizer, whose ids (< 261) fit the big vocabulary;
- tokens: the same tokenizer and chat template, whose ``{% generation %}`` markers give TRL its assistant mask;
  klear finds the assistant tokens by rendering prefixes. At start-up every conversation's token ids and labels are
  compared between the sides (as a multiset over the data, after packing: the first label of every packed
  conversation is ignored on both sides) and the run stops if they differ;
- packing: rows of at most ``--max-length`` tokens, best-fit decreasing on both sides, ``--batch-rows`` packed
  rows per optimizer step, all of them in one forward and backward pass (no gradient accumulation); positions
  restart at 0 for every conversation and attention stays inside it;
- loss: the token mean of the NLL over the assistant tokens of the step;
- optimizer: AdamW (the fused kernel on both), the same learning rate (constant, no warm-up), betas, eps, weight
  decay (on matrices only: for Qwen3 both sides exempt exactly the norms) and grad-norm clip;
- float32, no gradient checkpointing, ``torch.set_num_threads(--threads)`` (and ``OMP_NUM_THREADS``) on both.

TRL's options, as a TRL user packing long-CoT conversations would set them: ``packing=True`` with the default
``packing_strategy="bfd"`` (best-fit decreasing; TRL then switches on ``padding_free``, so a step's packed rows
are concatenated into one row with ``position_ids`` and ``cu_seq_lens``), ``assistant_only_loss=True`` (the loss
on the assistant's turns only, as klear's), ``max_length``, ``per_device_train_batch_size=--batch-rows``,
``gradient_accumulation_steps=1``, ``learning_rate``, ``lr_scheduler_type="constant"``, ``warmup_steps=0``,
``weight_decay``, ``adam_beta1/2``, ``adam_epsilon``, ``max_grad_norm`` (the optimizer stays TRL's default,
``adamw_torch_fused``), ``bf16=False`` and ``gradient_checkpointing=False`` (TRL's defaults are bf16 and
checkpointing), ``use_cpu=True``, ``logging_steps=1`` (klear logs every step too), ``save_strategy="no"``,
``report_to="none"``, ``dataloader_num_workers=0``. TRL's model gets transformers' default attention (``sdpa``);
klear's default ``model.attn_implementation: sdpa`` loads klear's ``sdpa_gqa``.

klear's side is klear's own SFT stage: :func:`klear.fit.build_stage` on a config with ``data.batching=packed``
and ``data.batch_size=--batch-rows``, and a real Lightning ``Trainer`` from :func:`klear.fit.build_trainer` running
``SFTModule.training_step``. Its in-training evaluation is switched off (TRL evaluates nothing either).

Not matched, because it is what each framework does:

- which conversations share a row and which rows share a step (each side's own packer and its own shuffle), so a
  step's real tokens differ between the sides; throughput is therefore reported per real (non-pad) token, and
  each side's real and labelled tokens per step and the token slots of its batch are printed. klear's batch pads
  a step's rows to the longest, but its step computes only the real tokens (one row without the pad tails, as
  TRL's padding-free row);
- the output head: klear computes it on the labelled positions only; TRL's fused head (on CPU, where it has no
  Triton) on every position, and it also computes each position's entropy and whether the label is the top-1
  token, for its logged metrics. Neither materialises the whole (tokens, vocabulary) logits;
- attention: TRL's padding-free row goes to transformers' ``sdpa``, which builds a block-diagonal mask over the
  whole row from the positions; klear's ``sdpa_gqa`` runs one causal call per conversation.

Each side runs in its own process, so that its peak resident memory (``VmHWM``, the kernel's high-water mark, read
after its last step) is its own. The two processes alternate step by step (klear, TRL, klear, ...): only one
computes at a time. A step's time runs from the end of the previous step to the end of this one: loading and
collating the batch, forward, backward, optimizer step and logging. The CPU time of a step is the process's
(``time.process_time``: all its threads), which other jobs on a shared machine barely disturb: on a loaded
machine, trust the per-CPU-second figures. The first ``--warmup`` steps of each side are dropped; the rest are
summarised by their median, and their totals (real tokens, seconds, CPU seconds) are printed too. The last line
gives klear/TRL ratios: tokens/s (and tokens per CPU second) and peak resident memory.

TRL runs only in its own environment: ``bash tools/trl_env.sh`` creates /tmp/venv-trl, then

    /tmp/venv-trl/bin/python tools/bench_sft_step.py [--steps 8] [--warmup 2] [--threads 1] [--max-length 512]
        [--batch-rows 8] [--shape tiny|qwen3-0.6b] [--layers 4]

``--klear-only`` runs klear's side alone (no TRL needed, so the project's own venv works); ``--profile
cprofile|torch`` runs klear's side alone in this process and prints a cProfile or torch.profiler table of its
timed steps.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tools' own modules (run as a script, or loaded)
from step_profiler import StepProfiler

ROOT = Path(__file__).resolve().parents[1]
MARK = "@@bench_sft_step "
SIDES = ("klear", "trl")
LAST_LINE = "bench_sft_step:"


# ----------------------------------------------------------------------------------------------------- data


def reasoning_row(rng: random.Random, steps: int) -> dict:
    """A conversation whose answer is a chain of ``steps`` arithmetic lines inside think tags, then a boxed answer."""
    start = value = rng.randint(2, 60)
    operations, lines = [], [f"Start with {start}."]
    for _ in range(steps):
        operation = rng.choice(["add", "subtract", "multiply"] if value < 200 else ["subtract", "add"])
        operand = rng.randint(2, 9) if operation == "multiply" else rng.randint(1, 99)
        if operation == "subtract" and operand > value:
            operation = "add"
        before = value
        value = {"add": value + operand, "subtract": value - operand, "multiply": value * operand}[operation]
        symbol = {"add": "+", "subtract": "-", "multiply": "*"}[operation]
        operations.append(f"{operation} {operand}" if operation != "multiply" else f"multiply by {operand}")
        lines.append(f"{before} {symbol} {operand} = {value}")
    prompt = f"Start with {start}, then {', then '.join(operations)}. What is the result?"
    thinking = "\n".join(lines)
    answer = f"<think>\n{thinking}\n</think>\n\nThe result is \\boxed{{{value}}}."
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def reasoning_rows(tokens: int, max_length: int, batch_rows: int, seed: int) -> list[dict]:
    """Rows with long-tailed lengths (each at most ``max_length`` tokens) totalling at least ``tokens`` tokens, that
    klear packs into a multiple of ``batch_rows`` rows."""
    from klear.data.packing import pack
    from klear.data.sft import tokenize_conversation
    from klear.models.tokenizer import build_tokenizer

    tokenizer, rng = build_tokenizer(), random.Random(seed)
    tokenizer.model_max_length = max(tokenizer.model_max_length, 4 * max_length)  # no warning about long drafts
    per_step, overhead = 22, 100  # tokens of one arithmetic step (prompt and reasoning line), of the rest, roughly
    median_steps = max(1.0, (max_length / 3 - overhead) / per_step)
    rows, lengths = [], []
    # Until there are enough tokens, and whole steps of packed rows (so no step of a pass is short of rows).
    while sum(lengths) < tokens or len(pack(lengths, max_length)) % batch_rows:
        steps = max(1, round(math.exp(rng.gauss(math.log(median_steps), 0.8))))
        row = reasoning_row(rng, steps)
        length = len(tokenize_conversation(tokenizer, row["messages"])["input_ids"])
        if length <= max_length:
            rows.append(row)
            lengths.append(length)
    return rows


def model_path(args: argparse.Namespace) -> str:
    """``model.path`` of the benchmark's model (built once into ``--cache`` for the Qwen3-0.6B shape)."""
    if args.shape == "tiny":
        return "tiny-sft"
    from klear.models.tiny import QWEN3_0_6B, build_tiny

    folder = Path(args.cache) / f"qwen3-0.6b-shape-{args.layers}-layers"
    return str(build_tiny(folder, **{**QWEN3_0_6B, "num_hidden_layers": args.layers}))


def documents_digest(docs: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> dict:
    """What the start-up check compares: the multiset of (token ids, labels) of the conversations of the data."""
    digest = hashlib.sha256(repr(sorted(docs)).encode()).hexdigest()[:16]
    labelled = sum(sum(label != -100 for label in labels) for _, labels in docs)
    return {
        "digest": digest,
        "conversations": len(docs),
        "tokens": sum(len(ids) for ids, _ in docs),
        "labelled": labelled,
    }


def split_row(ids: list[int], labels: list[int], lengths: list[int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A packed row's conversations, each with its first label ignored (neither side learns it in a packed row)."""
    docs, start = [], 0
    for length in lengths:
        doc_labels = [-100, *labels[start + 1 : start + length]]
        docs.append((tuple(ids[start : start + length]), tuple(doc_labels)))
        start += length
    return docs


# -------------------------------------------------------------------------------------------- one side


class Channel:
    """A side's link to the driver: reports (one marked JSON line each) and, between steps, waiting for ``go``."""

    def __init__(self, stream=None, on_step: Callable[[int], None] | None = None) -> None:
        self.stream = stream  # None: in-process (profiling), nothing to wait for
        self.on_step = on_step
        self.reports: list[dict] = []
        self.started = self.cpu_started = 0.0

    def send(self, **report) -> None:
        self.reports.append(report)
        if self.stream is not None:
            self.stream.write(MARK + json.dumps(report) + "\n")
            self.stream.flush()

    def wait(self) -> None:
        """Block until the driver says ``go``; exit at once when it closes the pipe (after the last step)."""
        if self.stream is not None and not sys.stdin.readline():
            os._exit(0)  # nothing after the last step (checkpoint, export) is part of the benchmark
        self.started, self.cpu_started = time.perf_counter(), time.process_time()

    def step_done(self, index: int, real: int, labelled: int, slots: int) -> None:
        seconds, cpu = time.perf_counter() - self.started, time.process_time() - self.cpu_started
        from klear.runtime.memory import status_bytes

        self.send(
            kind="step", index=index, seconds=seconds, cpu_seconds=cpu, real=real, labelled=labelled,
            slots=slots, peak_rss=status_bytes("VmHWM"),
        )  # fmt: skip
        if self.on_step is not None:
            self.on_step(index)
        self.wait()


def klear_overrides(args: argparse.Namespace, folder: Path) -> list[str]:
    return [
        "stage=sft",
        f"output_dir={folder / 'klear'}",
        f"model.path={model_path(args)}",
        f"data.train={folder / 'rows.jsonl'}",
        "data.num_eval=1",
        f"data.max_length={args.max_length}",
        "data.batching=packed",
        f"data.batch_size={args.batch_rows}",
        "data.micro_batch_size=0",  # the whole step in one forward and backward, as TRL's one padding-free row
        f"optim.lr={args.lr}",
        f"optim.min_lr={args.lr}",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        f"optim.weight_decay={args.weight_decay}",
        f"trainer.max_steps={args.warmup + args.steps}",
        "trainer.accelerator=cpu",
        "trainer.progress_bar=false",
        "trainer.checkpoint_every_n_steps=0",
        f"trainer.cpu_threads={args.threads}",
        "eval.every_n_steps=0",
        f"seed={args.seed}",
    ]


def klear_documents(batches, pad: int) -> tuple[list, list[int]]:
    """The conversations (token ids, labels) of one pass over klear's packed batches, and each row's real tokens."""
    docs, rows = [], []
    for planned in batches.items:
        batch = batches.collate([planned])
        columns = (batch[key].tolist() for key in ("input_ids", "labels", "position_ids"))
        for ids, labels, positions in zip(*columns, strict=True):
            starts = [i for i, position in enumerate(positions) if position == 0] + [len(ids)]
            lengths = [end - start for start, end in itertools.pairwise(starts) if ids[start] != pad]  # no pad tail
            docs += split_row(ids, labels, lengths)
            rows.append(sum(lengths))
    return docs, rows


def klear_side(args: argparse.Namespace, folder: Path, channel: Channel) -> None:
    """klear's SFT stage through a real Lightning Trainer; reports each step to ``channel``."""
    import lightning as L

    from klear.config.load import load_config
    from klear.fit import build_stage, build_trainer, prepare_run_dir
    from klear.runtime.memory import status_bytes

    config = load_config(None, klear_overrides(args, folder))
    run_dir = prepare_run_dir(config, resume=False, overwrite=True)
    before_model = status_bytes("VmRSS")
    module, batches = build_stage(config, run_dir)
    module.eval_due = lambda step: False  # no in-training evaluation (TRL's side evaluates nothing)
    module.on_train_end = lambda: None  # in this process (--profile): no final evaluation and export either
    pad = module.tokenizer.pad_token_id
    docs, rows = klear_documents(batches, pad)
    info = {"rows": len(rows), "fill": sum(rows) / (len(rows) * args.max_length), "before_model": before_model}

    class Steps(L.Callback):
        def on_train_start(self, trainer, module) -> None:
            channel.send(kind="ready", documents=documents_digest(docs), **info)
            channel.wait()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx: int) -> None:
            real = int((batch["input_ids"] != pad).sum())
            labelled = int((batch["labels"] != -100).sum())
            channel.step_done(batch_idx, real, labelled, batch["input_ids"].numel())

    trainer = build_trainer(config, run_dir, resume=False, extra_callbacks=[Steps()])
    trainer.fit(module, train_dataloaders=batches)


def trl_config(args: argparse.Namespace, folder: Path):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(folder / "trl"),
        max_length=args.max_length,
        packing=True,  # packing_strategy="bfd" (the default), which switches padding_free on
        assistant_only_loss=True,
        per_device_train_batch_size=args.batch_rows,
        gradient_accumulation_steps=1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=args.weight_decay,
        adam_beta1=0.9,  # klear's optim.betas
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,  # klear's optim.grad_clip
        max_steps=args.warmup + args.steps,
        seed=args.seed,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def trl_side(args: argparse.Namespace, folder: Path, channel: Channel) -> None:
    """TRL's SFTTrainer on the same rows and model; reports each step to ``channel``."""
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTTrainer

    from klear.config import ModelConfig
    from klear.models import load_model, load_tokenizer
    from klear.runtime.memory import status_bytes

    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    before_model = status_bytes("VmRSS")
    model_config = ModelConfig(path=model_path(args))
    model = load_model(model_config, cpu_threads=args.threads)
    model.set_attn_implementation("sdpa")  # transformers' default, as a TRL user's model has
    trainer = SFTTrainer(
        model=model,
        args=trl_config(args, folder),
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(model_config),
    )
    trainer.remove_callback(PrinterCallback)  # TRL still computes and logs its metrics; just not to stdout
    packed = trainer.train_dataset
    docs = [
        doc
        for row in packed
        for doc in split_row(list(row["input_ids"]), list(row["labels"]), list(row["seq_lengths"]))
    ]
    lengths = [sum(row["seq_lengths"]) for row in packed]
    info = {"rows": len(lengths), "fill": sum(lengths) / (len(lengths) * args.max_length), "before_model": before_model}
    last: dict[str, int] = {}
    collate = trainer.data_collator

    def counted(examples):
        batch = collate(examples)
        last.update(real=batch["input_ids"].numel(), labelled=int((batch["labels"] != -100).sum()))
        last["slots"] = last["real"]  # padding-free: one row of real tokens
        return batch

    trainer.data_collator = counted
    trainer.train_dataloader = None

    class Steps(TrainerCallback):
        def on_train_begin(self, training_args, state, control, **kwargs):
            channel.send(kind="ready", documents=documents_digest(docs), **info)
            channel.wait()

        def on_step_end(self, training_args, state, control, **kwargs):
            channel.step_done(state.global_step - 1, **last)

    trainer.add_callback(Steps())
    torch.set_num_threads(args.threads)
    trainer.train()


def serve(args: argparse.Namespace) -> None:
    """``--serve SIDE``: run one side, talking to the driver through marked lines on the original stdout."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # libraries' prints go to the side's log, never into the protocol
    side = {"klear": klear_side, "trl": trl_side}[args.serve]
    side(args, Path(args.folder), Channel(protocol))


# ----------------------------------------------------------------------------------------------- driver


class Side:
    """A side's process: started with ``--serve``, stepped with ``go`` lines, read through its marked lines."""

    def __init__(self, name: str, folder: Path, argv: list[str]) -> None:
        self.name, self.log = name, folder / f"{name}.log"
        command = [sys.executable, str(Path(__file__).resolve()), *argv, "--serve", name, "--folder", str(folder)]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT
            )

    def read(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.process.wait()
        tail = self.log.read_text()[-4000:]
        raise SystemExit(f"the {self.name} side exited ({self.process.returncode}) before reporting:\n{tail}")

    def step(self) -> dict:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=120)


def check_same_documents(ready: dict[str, dict]) -> None:
    """Both sides train on the same conversations, token for token and label for label (or the run stops)."""
    klear, trl = ready["klear"]["documents"], ready["trl"]["documents"]
    if klear != trl:
        raise SystemExit(f"the sides see different data: klear {klear}, trl {trl}")
    print(
        f"same data on both sides: {klear['conversations']} conversations, {klear['tokens']} tokens, "
        f"{klear['labelled']} labelled (digest {klear['digest']}); packed rows: "
        + ", ".join(f"{name} {info['rows']} ({info['fill']:.1%} full)" for name, info in ready.items())
    )


def drive(args: argparse.Namespace, folder: Path, names: tuple[str, ...]) -> dict[str, list[dict]]:
    """Start the sides, check their data, then step them in turn; each side's step reports."""
    argv = [arg for arg in sys.argv[1:]]
    sides = {name: Side(name, folder, argv) for name in names}
    try:
        ready = {name: side.read() for name, side in sides.items()}
        if len(names) == 2:
            check_same_documents(ready)
        steps: dict[str, list[dict]] = {name: [] for name in names}
        for _ in range(args.warmup + args.steps):
            for name, side in sides.items():
                steps[name].append(side.step())
        for side in sides.values():
            side.close()
    finally:
        for side in sides.values():
            if side.process.poll() is None:
                side.process.kill()
    return {name: [{**ready[name], **step} for step in runs] for name, runs in steps.items()}


def summarise(name: str, steps: list[dict]) -> dict[str, float]:
    timed = steps
    median = {key: statistics.median(step[key] for step in timed) for key in ("seconds", "cpu_seconds", "real")}
    tokens_per_s = statistics.median(step["real"] / step["seconds"] for step in timed)
    tokens_per_cpu_s = statistics.median(step["real"] / step["cpu_seconds"] for step in timed)
    labelled = statistics.median(step["labelled"] for step in timed)
    slots = statistics.median(step["slots"] for step in timed)
    peak, before = timed[-1]["peak_rss"], timed[-1]["before_model"]
    print(
        f"{name:5s} {median['seconds']:.3f} s/step ({1 / median['seconds']:.3f} steps/s), {tokens_per_s:.0f} tokens/s, "
        f"{median['cpu_seconds']:.3f} CPU s/step (its process), {tokens_per_cpu_s:.0f} tokens per CPU s; "
        f"peak RSS {peak / 1e9:.3f} GB ({(peak - before) / 1e9:.3f} GB above the process before the model loaded)"
    )
    print(
        f"      per step (median): {median['real']:.0f} real tokens, {labelled:.0f} labelled, {slots:.0f} slots in "
        f"the batch (with padding); real tokens, each timed step: {' '.join(str(step['real']) for step in timed)}"
    )
    real, seconds, cpu = (sum(step[key] for step in timed) for key in ("real", "seconds", "cpu_seconds"))
    print(f"      all timed steps: {real} real tokens in {seconds:.2f} s, {cpu:.2f} CPU s ({real / cpu:.0f} per CPU s)")
    return {
        "steps_per_s": 1 / median["seconds"],
        "tokens_per_s": tokens_per_s,
        "tokens_per_cpu_s": tokens_per_cpu_s,
        "peak": peak,
    }


def profile_klear(args: argparse.Namespace, folder: Path) -> dict[str, list[dict]]:
    """klear's side in this process under ``--profile``; its step reports."""
    channel = Channel(on_step=StepProfiler(args.profile, args.warmup, args.warmup + args.steps).step_done)
    klear_side(args, folder, channel)
    ready = next(report for report in channel.reports if report["kind"] == "ready")
    return {"klear": [{**ready, **report} for report in channel.reports if report["kind"] == "step"]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of both sides")
    parser.add_argument("--max-length", type=int, default=512, help="tokens per packed row (and per conversation)")
    parser.add_argument("--batch-rows", type=int, default=8, help="packed rows per optimizer step")
    parser.add_argument("--shape", choices=["tiny", "qwen3-0.6b"], default="tiny")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the qwen3-0.6b shape")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "klear-bench-sft-step"))
    parser.add_argument("--klear-only", action="store_true", help="run klear's side alone (no TRL needed)")
    parser.add_argument(
        "--profile", choices=["cprofile", "torch"], help="run klear alone in this process and profile its timed steps"
    )
    parser.add_argument("--serve", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < (1 if args.profile else 0):
        parser.error("--steps must be at least 1, and --warmup at least 1 with --profile")
    return args


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before torch is imported
        os.environ[variable] = str(args.threads)
    if args.serve:
        return serve(args)
    names = ("klear",) if args.klear_only or args.profile else SIDES
    if "trl" in names:
        try:
            import trl  # noqa: F401
        except ImportError:
            sys.exit(
                "TRL is not installed here: run `bash tools/trl_env.sh` and use /tmp/venv-trl/bin/python, or "
                "pass --klear-only"
            )
    load = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="bench_sft_step."))
    tokens = (args.warmup + args.steps + 1) * args.batch_rows * args.max_length
    rows = reasoning_rows(tokens, args.max_length, args.batch_rows, args.seed)
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    model_path(args)  # the qwen3-0.6b shape is built once, before either side starts
    results = profile_klear(args, folder) if args.profile else drive(args, folder, names)
    shutil.rmtree(folder, ignore_errors=True)  # kept when a side failed: its log is there
    print(f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    summaries = {name: summarise(name, steps[args.warmup :]) for name, steps in results.items()}
    ours = summaries["klear"]
    setting = (
        f"shape={args.shape}{f' ({args.layers} layers)' if args.shape != 'tiny' else ''} max_length={args.max_length} "
        f"rows/step={args.batch_rows} threads={args.threads}"
    )
    if len(summaries) == 1:
        print(
            f"{LAST_LINE} {setting}: klear {ours['steps_per_s']:.3f} steps/s {ours['tokens_per_s']:.0f} tok/s, "
            f"peak RSS {ours['peak'] / 1e9:.3f} GB"
        )
        return
    theirs = summaries["trl"]
    print(
        f"{LAST_LINE} {setting}: klear {ours['steps_per_s']:.3f} steps/s {ours['tokens_per_s']:.0f} tok/s, "
        f"trl {theirs['steps_per_s']:.3f} steps/s {theirs['tokens_per_s']:.0f} tok/s; "
        f"klear/trl tokens/s ratio: {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x "
        f"(per CPU second: {ours['tokens_per_cpu_s'] / theirs['tokens_per_cpu_s']:.2f}x), "
        f"peak memory ratio (klear/trl): {ours['peak'] / theirs['peak']:.2f}x"
    )


if __name__ == "__main__":
    main()
