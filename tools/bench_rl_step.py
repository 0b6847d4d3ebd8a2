"""One RL step of klear vs one step of TRL's GRPOTrainer on the same work, on CPU, alternating in one process.

Both sides train the shipped ``tiny-sft`` checkpoint (loaded twice with :func:`klear.models.load_model`) on the
synthetic task's problems, and each step is one rollout followed by exactly one optimizer update. Matched:

- prompts: the very same problems in the same order (klear's seeded batches, handed to TRL as an unshuffled
  dataset of chat prompts), token for token the same prompt ids (checked at start-up);
- sampling: group size, ``max_new_tokens``, temperature, top-p, top-k, the same stop tokens (the model's
  generation config and the tokenizer's eos); TRL generates with its default path (transformers' ``generate``,
  KV cache, no vLLM, no continuous batching);
- reward: klear's ``math`` reward through the same :class:`klear.rewards.scorer.RewardScorer` code path, wrapped
  as a plain TRL reward function;
- objective: DAPO clip-higher (eps 0.2 / 0.28), token-mean over the update (TRL ``loss_type="dapo"``), no KL term,
  no reference model, no entropy bonus; advantages: group z-scores on both;
- optimizer: AdamW, the same learning rate (constant, no warmup), betas, eps, weight decay, grad-norm clip;
- batch shapes: micro-batches of ``--micro-batch`` sequences accumulated into one update of all
  ``prompts x group`` responses (TRL: ``per_device_train_batch_size`` = micro-batch, gradient accumulation and
  ``steps_per_generation`` = the number of micro-batches, ``num_iterations=1``, so it skips its old-log-prob pass
  exactly as klear does with ``rollout.old_logprobs=engine``);
- precision float32, no gradient checkpointing (TRL's defaults are bf16 and checkpointing: switched off here);
  TRL's model gets transformers' default attention (``sdpa``), as a TRL user's would; klear's default
  ``model.attn_implementation: sdpa`` loads klear's ``sdpa_gqa`` (:mod:`klear.models.attention`: the same values,
  without the copy of the grouped K/V heads that transformers' ``sdpa`` makes under a mask on CPU);
- klear's zero-variance group filter is off, so both train on every response.

Not matched, because it is what each framework does: TRL keeps finished rows in the batch until the longest one
stops (its padded slots are reported), klear drops them. The samples differ (different random streams), so the
response lengths differ from step to step: throughput is reported as generated tokens/s (tokens up to and including
the stop token, the same count on both sides) as well as steps/s. Each side also reports the CPU time of its own
thread per step (torch runs intra-op work on the calling thread at one thread), which other jobs on a shared
machine barely disturb: on a loaded machine, trust the CPU-time ratio over the wall-clock one.

The two training loops run in two threads, strictly alternating (klear step, TRL step, klear step, ...): only one
runs at a time, both with the same ``torch.set_num_threads``. Each side's step is the wall time it held the
baton: its whole loop iteration, logging and weight refresh included. The first ``--warmup`` steps of each side
are dropped; the rest are summarised by their median. klear's step is also split into generation, reward,
log-prob forward, backward and the rest of the update (from timers wrapped around those calls, nothing in
``src/`` is changed), and TRL's likewise.

TRL runs only in its own environment: ``bash tools/trl_env.sh`` creates /tmp/venv-trl, then

    /tmp/venv-trl/bin/python tools/bench_rl_step.py [--prompts 16] [--group 8] [--max-new-tokens 96]
        [--micro-batch 32] [--steps 8] [--warmup 2] [--threads 1]

``--profile cprofile|torch`` runs klear alone (no TRL needed, so the project's own venv works) and prints a
cProfile or torch.profiler table of the timed steps.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tools' own modules (run as a script, or loaded)
from step_profiler import StepProfiler


class Baton:
    """Strict alternation of two loops in two threads: only the holder runs; a finished side never blocks."""

    def __init__(self, first: str) -> None:
        self.turn = first
        self.finished: set[str] = set()
        self.condition = threading.Condition()

    def wait(self, me: str) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.turn == me or self.finished - {me})

    def hand_over(self, me: str, other: str) -> None:
        with self.condition:
            self.turn = other
            self.condition.notify_all()
        self.wait(me)

    def finish(self, me: str, other: str) -> None:
        with self.condition:
            self.finished.add(me)
            self.turn = other
            self.condition.notify_all()


class Clock:
    """Per-step wall time of one side, and the time spent inside the calls it wraps."""

    def __init__(self) -> None:
        self.pieces: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.started = self.cpu_started = 0.0

    def wrap(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.pieces[name] += time.perf_counter() - started
                self.pieces[f"{name}_calls"] += 1

        return timed

    def start(self) -> None:
        self.pieces.clear()
        self.started, self.cpu_started = time.perf_counter(), time.thread_time()

    def stop(self, **extra: float) -> None:
        cpu = time.thread_time() - self.cpu_started  # this side's own thread: robust to other jobs on the machine
        self.steps.append({"seconds": time.perf_counter() - self.started, "cpu_seconds": cpu, **self.pieces, **extra})


def klear_config(args: argparse.Namespace, output_dir: str):
    from klear.config.load import load_config

    overrides = [
        f"output_dir={output_dir}",
        "model.path=tiny-sft",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.temperature={args.temperature}",
        f"rollout.top_p={args.top_p}",
        "rollout.top_k=0",
        f"rollout.batch_size={args.prompts * args.group}",
        "objective.name=dapo",
        f"algorithm.mini_batch_prompts={args.prompts}",  # one optimizer update per rollout
        f"algorithm.micro_batch_size={args.micro_batch}",
        "algorithm.filter_groups=false",  # TRL trains on every group
        f"optim.lr={args.lr}",
        f"optim.min_lr={args.lr}",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        f"trainer.max_steps={args.warmup + args.steps}",
        "trainer.accelerator=cpu",
        "trainer.progress_bar=false",
        "trainer.checkpoint_every_n_steps=0",
        "eval.every_n_steps=0",  # evaluated only before the first step (a warm-up step) and after the last
        "eval.num_prompts=8",
    ]
    return load_config("configs/rl.yaml", overrides)


def build_trl(args: argparse.Namespace, config, problems: list, clock: Clock, output_dir: str):
    """A GRPOTrainer on the same model, prompts, reward and hyperparameters (see the module docstring)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from klear.models import load_model, load_tokenizer
    from klear.rewards import score_batch
    from klear.rewards.scorer import RewardScorer

    scorer = RewardScorer.from_config(config.reward, config.rollout.max_new_tokens)

    def math_reward(completions, answer, completion_ids, **_) -> list[float]:
        clock.pieces["tokens"] += sum(len(ids) for ids in completion_ids)
        texts = [completion[-1]["content"] for completion in completions]
        return score_batch(scorer.reward, texts, [str(a) for a in answer]).scores

    updates_per_rollout = args.prompts * args.group // args.micro_batch
    training = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=updates_per_rollout,
        steps_per_generation=updates_per_rollout,
        num_iterations=1,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=config.optim.weight_decay,
        adam_beta1=config.optim.betas[0],
        adam_beta2=config.optim.betas[1],
        adam_epsilon=config.optim.eps,
        max_grad_norm=config.optim.grad_clip,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        max_steps=args.warmup + args.steps,
        shuffle_dataset=False,
        seed=config.seed,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        use_vllm=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p.prompt}], "answer": p.reference} for p in problems]
    )
    model = load_model(config.model)
    model.set_attn_implementation("sdpa")  # transformers' default, whatever klear's own config chooses
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=math_reward,
        args=training,
        train_dataset=dataset,
        processing_class=load_tokenizer(config.model),
    )
    generate = trainer.model.generate

    def counted(input_ids, **kwargs):
        output = generate(input_ids=input_ids, **kwargs)
        clock.pieces["padded_slots"] += output.shape[0] * (output.shape[1] - input_ids.shape[1])
        return output

    trainer.model.generate = clock.wrap("generate", counted)
    trainer._get_per_token_logps_and_entropies = clock.wrap("logprob_fwd", trainer._get_per_token_logps_and_entropies)
    trainer.accelerator.backward = clock.wrap("backward", trainer.accelerator.backward)
    trainer.reward_funcs[0] = clock.wrap("reward", trainer.reward_funcs[0])
    return trainer


def check_same_prompts(tokenizer, problems: list) -> None:
    """klear's prompt encoding and TRL's (one batched chat-template call) give the same token ids."""
    from klear.data.prompts import encode_prompt

    conversations = [[{"role": "user", "content": problem.prompt}] for problem in problems[:8]]
    theirs = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=True, return_dict=True)
    for problem, ids in zip(problems, theirs["input_ids"], strict=False):
        if list(ids) != encode_prompt(tokenizer, problem.prompt):
            raise SystemExit(f"prompt ids differ between klear and TRL for {problem['problem']!r}")


def run(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    import lightning as L
    import torch

    import klear.kernels.passes
    import klear.stages.rl
    from klear.fit import build_stage, build_trainer, prepare_run_dir

    torch.set_num_threads(args.threads)
    folder = tempfile.mkdtemp(prefix="bench_rl_step.")  # run outputs (klear's run dir, TRL's output_dir)
    config = klear_config(args, f"{folder}/klear")
    run_dir = prepare_run_dir(config, resume=False, overwrite=True)
    module, batches = build_stage(config, run_dir)
    problems = [p for step in range(config.trainer.max_steps) for p in batches.batch_at(step)]
    module.reward.warmup()  # the sympy checker process starts now, not inside a timed step
    baton, klear_clock, trl_clock = Baton(first="trl"), Clock(), Clock()
    profiler = StepProfiler(args.profile, args.warmup, config.trainer.max_steps) if args.profile else None

    class KlearSteps(L.Callback):
        def on_train_start(self, trainer, module) -> None:
            engine = module.rollouts.engine
            generate = engine.generate

            def counted(prompts, sampling):
                rollouts = generate(prompts, sampling)
                klear_clock.pieces["tokens"] += sum(len(r.response_ids) for r in rollouts)
                return rollouts

            engine.generate = klear_clock.wrap("generate", counted)
            module.rollouts.scorer.score = klear_clock.wrap("reward", module.rollouts.scorer.score)
            module.manual_backward = klear_clock.wrap("backward", module.manual_backward)
            # Every log-prob pass of a step (no-grad, loss, KL reference) goes through LogprobPasses.logprobs.
            passes = klear.kernels.passes
            passes.token_logprobs = klear_clock.wrap("logprob_fwd", passes.token_logprobs)
            klear_clock.start()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx: int) -> None:
            metrics = module.step_metrics
            klear_clock.stop(
                rollout_s=metrics["timing/rollout_s"],
                update_s=metrics.get("timing/update_s", 0.0),
                threads=torch.get_num_threads(),
            )
            if profiler is not None:
                profiler.step_done(batch_idx)
            else:
                baton.hand_over("klear", "trl")
            klear_clock.start()

    thread, errors = None, []
    if profiler is None:
        check_same_prompts(module.tokenizer, problems)
        thread = start_trl(args, config, problems, trl_clock, baton, f"{folder}/trl", errors)
        baton.wait("klear")
    trainer = build_trainer(config, run_dir, resume=False, extra_callbacks=[KlearSteps()])
    try:
        trainer.fit(module, train_dataloaders=batches)
    finally:
        baton.finish("klear", "trl")
        if thread is not None:
            thread.join()
    shutil.rmtree(folder, ignore_errors=True)
    if errors:
        raise errors[0]
    return klear_clock.steps[args.warmup :], trl_clock.steps[args.warmup :]


def start_trl(args, config, problems, clock: Clock, baton: Baton, output_dir: str, errors: list) -> threading.Thread:
    """TRL's training loop in a thread that runs only while it holds the baton, one optimizer step at a time."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    last = config.trainer.max_steps

    class TRLSteps(TrainerCallback):
        def on_train_begin(self, training_args, state, control, **kwargs):
            baton.hand_over("trl", "klear")  # set up, then wait for klear's first step
            clock.start()

        def on_step_end(self, training_args, state, control, **kwargs):
            clock.stop(threads=torch.get_num_threads())
            if state.global_step >= last:
                baton.finish("trl", "klear")
            else:
                baton.hand_over("trl", "klear")
                clock.start()

    trainer = build_trl(args, config, problems, clock, output_dir)
    trainer.add_callback(TRLSteps())
    trainer.remove_callback(PrinterCallback)  # TRL still computes and logs its metrics; just not to stdout

    def train() -> None:
        torch.set_num_threads(args.threads)
        try:
            trainer.train()
        except BaseException as error:
            errors.append(error)
        finally:
            baton.finish("trl", "klear")

    thread = threading.Thread(target=train, name="trl", daemon=True)
    thread.start()
    return thread


def summarise(name: str, steps: list[dict]) -> dict[str, float]:
    median = {key: statistics.median(step.get(key, 0.0) for step in steps) for key in {k for s in steps for k in s}}
    seconds = median["seconds"]
    tokens_per_s = statistics.median(step["tokens"] / step["seconds"] for step in steps)
    parts = ["generate", "reward", "logprob_fwd", "backward"]
    rest = statistics.median(step["seconds"] - sum(step.get(part, 0.0) for part in parts) for step in steps)
    split = "  ".join(f"{part} {median.get(part, 0.0):.3f}s ({median.get(part, 0.0) / seconds:.0%})" for part in parts)
    print(
        f"{name:5s} {seconds:.3f} s/step ({1 / seconds:.3f} steps/s), {median['tokens']:.0f} generated tokens/step, "
        f"{tokens_per_s:.0f} tokens/s, {median['cpu_seconds']:.3f} CPU s/step (its thread), "
        f"torch threads {median['threads']:.0f}"
    )
    print(f"      split: {split}  rest {rest:.3f}s ({rest / seconds:.0%})")
    calls = ", ".join(f"{part} x{median[f'{part}_calls']:.0f}" for part in parts if f"{part}_calls" in median)
    print(f"      calls per step: {calls}")
    if "padded_slots" in median:
        print(f"      generated slots incl. padding after the stop token: {median['padded_slots']:.0f}/step")
    if "rollout_s" in median:
        print(
            f"      module timers: timing/rollout_s {median['rollout_s']:.3f}s, "
            f"timing/update_s {median['update_s']:.3f}s"
        )
    return {"steps_per_s": 1 / seconds, "tokens_per_s": tokens_per_s, "cpu_seconds": median["cpu_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (configs/rl.yaml: 16)")
    parser.add_argument("--group", type=int, default=8, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--micro-batch", type=int, default=32, help="sequences per forward/backward pass")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of both sides")
    parser.add_argument(
        "--profile", choices=["cprofile", "torch"], help="run klear alone and profile its timed steps (no TRL needed)"
    )
    args = parser.parse_args()
    if (args.prompts * args.group) % args.micro_batch:
        parser.error("--micro-batch must divide prompts x group")
    if args.profile and args.warmup < 1:
        parser.error("--profile starts after the warm-up steps: give --warmup 1 or more")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before torch is imported
        os.environ[variable] = str(args.threads)
    load = os.getloadavg()
    klear_steps, trl_steps = run(args)
    print(f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    ours = summarise("klear", klear_steps)
    if args.profile:
        return
    theirs = summarise("trl", trl_steps)
    print(
        f"bench_rl_step: P={args.prompts} G={args.group} T={args.max_new_tokens} micro={args.micro_batch} "
        f"threads={args.threads}: klear {ours['steps_per_s']:.3f} steps/s {ours['tokens_per_s']:.0f} tok/s, "
        f"trl {theirs['steps_per_s']:.3f} steps/s {theirs['tokens_per_s']:.0f} tok/s; "
        f"klear/trl steps/s ratio: {ours['steps_per_s'] / theirs['steps_per_s']:.2f}x, "
        f"tokens/s ratio: {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x, "
        f"CPU s/step ratio (trl/klear): {theirs['cpu_seconds'] / ours['cpu_seconds']:.2f}x"
    )


if __name__ == "__main__":
    main()
