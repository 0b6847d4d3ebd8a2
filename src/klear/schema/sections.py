"""Run configuration: one dataclass per section, merged with ``OmegaConf.structured``.

Defaults live here and only here; each field is documented once, right under it. YAML files in ``configs/``
list only their deviations, and ``key=value`` overrides come last. Merging into the structured schema is what
makes an unknown key or a wrong type fail with its name; the checks in :mod:`klear.config.load` add the
closed sets of accepted values (``choices``) and combinations the types cannot express; a mapping field's
``example`` metadata is what their message shows when it is given anything but a mapping.

``trainer.max_steps`` counts training steps in both stages: one step is one batch of ``data.batch_size`` rows and
one optimizer update in SFT (accumulated over micro-batches of ``data.micro_batch_size`` rows), and one
rollout -> update iteration in RL, whatever number of mini-batch optimizer updates that takes. SFT's
``trainer.epochs`` gives the run's length in passes over its data instead (`SFTTrainerConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klear.schema.fields import (
    at_least,
    choice,
    positive,
    seed_field,
    synthetic_count,
    within,
)


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA) trained in place of the model's weights, built with Hugging Face PEFT (the ``lora``
    extra): the base weights stay frozen, with no gradient and no optimizer state; the KL reference is the base
    model with the adapters switched off (no second copy). Names as PEFT's ``LoraConfig`` (``alpha`` is its
    ``lora_alpha``, ``dropout`` its ``lora_dropout``); see docs/lora.md."""

    r: int = at_least(16, 1)
    """The adapters' rank."""
    alpha: float = positive(32.0)
    """The scaling numerator: an adapter's update is multiplied by ``alpha / r``."""
    dropout: float = within(0.0, 0, 1, open_high=True)
    """Dropout on the adapters' input (0 keeps a step's forward passes deterministic given the seed)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """The linear layers that get adapters, by name (``q_proj``, ``down_proj``, ...); ``all-linear``: every linear
    layer of the decoder (not the output head)."""
    modules_to_save: list[str] = field(default_factory=list)
    """Modules trained whole beside the adapters (e.g. ``lm_head``), saved with them."""
    adapter: str = ""
    """A PEFT adapter folder to start from (``adapter/`` of an earlier run), trained further; its own
    ``adapter_config.json`` then sets the rank, ``alpha`` and the target modules. Empty: fresh adapters (B = 0, so
    the first step starts from the base model exactly)."""


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
"""The ``model.rope_scaling.rope_type`` names transformers knows (``transformers.modeling_rope_utils``'s
``ROPE_INIT_FUNCTIONS`` and ``default``), written out: importing that module imports torch, and the config is
checked before any heavy import (tests/config compares the two)."""


def is_hub_name(path: str) -> bool:
    """Whether ``model.path`` can only name a model of the Hugging Face Hub (``name`` or ``org/name``): nothing is
    at that path here, and it is not written as a path (``/``, ``.`` or ``~`` first, or more than one ``/``)."""
    return not (Path(path).expanduser().exists() or path.startswith(("/", ".", "~")) or path.count("/") > 1)


@dataclass
class ModelConfig:
    path: str = "tiny"
    """A Hugging Face model directory or hub name; ``tiny``: the built-in tiny Qwen3 (built locally from a seed);
    ``tiny-sft``: that model after ``configs/sft.yaml`` (shipped; where the RL stage starts by default)."""
    dtype: str = choice("auto", "float32", "bfloat16")
    """Parameter dtype; ``auto`` is bfloat16 on CUDA and float32 on CPU (and float32 master weights under
    ``trainer.strategy=fsdp2``, which computes in bfloat16 through its mixed-precision policy). Trained weights held
    in bfloat16 are stepped through float32 master copies the optimizer keeps, so updates far below a bfloat16
    weight's spacing (the paper's lr 1e-6) are not lost."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    attn_implementation: str = choice("sdpa", "eager", "flash_attention_2")
    """The transformers attention kernel."""
    rope_scaling: dict[str, Any] = field(
        default_factory=dict,
        metadata={"example": "{rope_type: yarn, factor: 2.5, original_max_position_embeddings: 32768}"},
    )
    """Replaces the model config's ``rope_scaling`` (for both engines), e.g. ``{rope_type: yarn, factor: 2.5,
    original_max_position_embeddings: 32768}`` to run Qwen3 past its 32K context as the paper's 64K evaluation
    does; ``max_position_embeddings`` becomes ``factor`` x the original. Empty: the model's own."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of the whole model (``model.lora.r=8`` turns it on with the defaults below);
    null: full fine-tuning."""


@dataclass
class OptimConfig:
    lr: float = positive(8e-5)
    """Peak learning rate of AdamW (the paper's SFT: 8e-5 decayed to 4e-5)."""
    min_lr: float = at_least(4e-5, 0)
    """Learning rate at the end of the cosine schedule."""
    schedule: str = choice("cosine", "constant")
    """After warmup: cosine decay to ``min_lr`` over ``trainer.max_steps``, or constant."""
    warmup_steps: int = at_least(10, 0)
    """Linear warmup from 0 over this many optimizer steps."""
    warmup_ratio: float = within(0.0, 0, 1, open_high=True)
    """Linear warmup over this share of the run's steps (``trainer.max_steps``, or the steps SFT's
    ``trainer.epochs`` counts), rounded up; above 0 it takes the place of ``warmup_steps``."""
    weight_decay: float = at_least(0.1, 0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = positive(1e-8)
    grad_clip: float = at_least(1.0, 0)
    """Clip the global gradient norm to this value; 0 disables clipping."""


@dataclass
class TrainerConfig:
    max_steps: int = within(300, 1, 2**31, open_high=True)
    """Training steps (see the module docstring for what one step is in each stage)."""
    accelerator: str = choice("auto", "cpu", "gpu")
    devices: int = within(1, 1, 1024, why="devices of one node: its GPUs, or CPU processes")
    """Devices per node."""
    num_nodes: int = at_least(1, 1)
    precision: str = choice("auto", "32-true", "bf16-true", "bf16-mixed")
    """``auto``: bf16-mixed on CUDA, 32-true on CPU. ``bf16-true`` loads the policy in bfloat16 whatever
    ``model.dtype`` says, as ``model.dtype=bfloat16`` does (its float32 buffers, RoPE's frequencies, kept; its trained
    weights stepped through float32 masters), under a Trainer at 32-true; under ``fsdp2`` only with LoRA."""
    strategy: str = choice("auto", "ddp", "fsdp2")
    """``auto``: single device; ``ddp``: data parallel over ``devices`` x ``num_nodes``; ``fsdp2``: the same
    ranks with parameters, gradients and optimizer state sharded (``fully_shard`` per decoder layer and root)."""
    fsdp_mixed_precision: bool = True
    """``fsdp2`` on CUDA: bfloat16 parameters for compute, float32 master weights and gradient reduction."""
    fsdp_cpu_offload: bool = False
    """``fsdp2``: keep sharded parameters, gradients and optimizer state in CPU memory between uses."""
    fsdp_reshard_after_forward: bool = True
    """``fsdp2``: free the gathered layer after its forward (ZeRO-3); false keeps it until backward (ZeRO-2)."""
    log_every_n_steps: int = at_least(1, 1)
    checkpoint_every_n_steps: int = at_least(100, 0)
    """Save a resumable checkpoint every this many steps (and at the end); 0 only at the end."""
    keep_checkpoints: int = at_least(1, 0)
    """Checkpoints kept in ``checkpoints/``: the newest this many (each is a model too: ``model.path``, ``--model``);
    0 keeps every one."""
    keep_best: bool = False
    """Also keep the checkpoint whose step scored the highest ``best_metric`` (the earliest of equal ones);
    ``checkpoint_every_n_steps`` must then be a multiple of ``eval.every_n_steps``, so every checkpoint is scored."""
    best_metric: str = field(default="eval/accuracy", metadata={"example": "eval/accuracy/aime24"})
    """The evaluation metric that ranks the checkpoints (``keep_best``, and the best kept one the closing lines and
    ``summary.json`` name): ``eval/accuracy``, one of ``data.eval``'s sets' ``eval/accuracy/<set>`` (choose on a
    validation set, report on another), or ``eval/pass_at_K`` (``/<set>``) when the evaluation samples K > 1, and
    ``eval/maj_at_K`` (``/<set>``) too when its reward is ``math``."""
    progress_bar: bool = True
    cpu_threads: int = at_least(0, 0)
    """torch's CPU threads; 0: chosen by klear from the free cores and the model's size, logged at start and
    recorded in ``report.md`` and ``summary.json`` (``OMP_NUM_THREADS`` in the environment wins over both). The
    numbers do not depend on it (docs/performance.md#cpu-threads)."""


@dataclass
class SFTTrainerConfig(TrainerConfig):
    """The SFT stage's trainer: `TrainerConfig`, and the run's length in passes over its data."""

    epochs: float = within(0.0, 0, 10_000)
    """Passes over ``data.train``; 0: the run is ``max_steps`` steps long. Above 0 (a fraction too, ``1.5``), the
    run is that many passes: its steps are counted from the tokenized set (its packed rows too) before the first one,
    logged, and take the place of ``max_steps``, which ``config.yaml`` then records."""


@dataclass
class LoggingConfig:
    tensorboard: bool = False
    """Also write TensorBoard event files under ``<output_dir>/tensorboard``."""
    wandb: bool = False
    """Also log to Weights & Biases (needs ``pip install wandb``)."""
    wandb_project: str = "klear"
    samples: int = at_least(2, 0)
    """At each evaluation, ``samples.jsonl`` gets every answer to the first this-many problems of each held-out set,
    with its verdict, and (RL) every response of the step's first this-many prompt groups trained on, with its reward
    and advantage (also TensorBoard's text and a W&B table ``samples/<split>`` with ``tensorboard`` / ``wandb``); 0:
    none."""


@dataclass
class VLLMConfig:
    """Options of the vLLM rollout engine (``rollout.engine: vllm``), see :mod:`klear.rollout.vllm_engine`."""

    tensor_parallel_size: int = at_least(1, 1)
    """GPUs the engine shards the model over (vLLM tensor parallelism)."""
    gpu_memory_utilization: float = within(0.5, 0, 1, open_low=True)
    """Share of the GPU's memory vLLM may take for weights, activations and KV cache; the trainer shares the GPU."""
    kv_cache_memory_bytes: int = at_least(0, 0)
    """KV cache size in bytes. 0: on GPU, what ``gpu_memory_utilization`` leaves; on CPU, 256 MiB (unset, vLLM's
    CPU backend would reserve a share of the machine's memory, many GiB)."""
    dtype: str = choice("auto", "float32", "bfloat16")
    """Engine weights and compute; ``auto`` follows what the policy computes in: bfloat16 for bf16 precisions, on
    CUDA by default and under ``fsdp2``'s mixed precision on CUDA; float32 otherwise."""
    enable_sleep_mode: bool = True
    """Release the engine's GPU memory while the trainer updates (vLLM sleep level 1: weights offloaded to CPU
    memory, KV cache dropped) and take it back before each refresh. vLLM's CPU backend has none: ignored there."""
    enforce_eager: bool | None = None
    """Skip torch.compile and CUDA graphs. ``None``: eager on CPU (compiling costs more than it saves there),
    compiled with CUDA graphs on GPU."""
    max_model_len: int = at_least(0, 0)
    """Longest prompt + response the engine holds, in tokens; 0: what the run needs (its longest prompt + the larger
    of ``rollout.max_new_tokens`` and ``eval.max_new_tokens``), capped at the model's ``max_position_embeddings``.
    vLLM reserves KV cache for at least one such sequence; a value below the run's need is refused."""
    lora_adapters: bool | None = None
    """With model.lora, serve the trained adapters as vLLM's own LoRA (a new version each refresh) instead of loading
    the merged weights W + alpha/r BA. ``None``: chosen by the engine's device, the adapters on GPU and the merged
    weights on CPU, where vLLM samples through its LoRA kernels 2.5-2.7x slower (docs/scale-out.md). Where vLLM cannot
    serve them (``modules_to_save``, several training ranks, an adapted output head) the merged weights all the
    same. The engine logs its choice and why."""


@dataclass
class EvalConfig:
    every_n_steps: int = at_least(50, 0)
    """Evaluate before the first update, every this many steps, and after the last; 0: only before and after."""
    num_prompts: int = at_least(200, 1)
    """Held-out prompts scored at each evaluation (the same ones every time): the first of ``data.eval``, or of each
    of its sets."""
    max_new_tokens: int = at_least(96, 1)
    temperature: float = at_least(0.0, 0)
    """0: greedy decoding, accuracy of the single answer. Above 0: sampled, ``samples`` per prompt (avg@k)."""
    top_p: float = within(1.0, 0, 1, open_low=True)
    samples: int = at_least(1, 1)
    """Samples per prompt when ``temperature > 0``; ``eval/accuracy`` is their mean (avg@k)."""
    batch_size: int = at_least(100, 1)
    reward: str = "math"
    """SFT: the reward that decides correctness (its verdict: math an equivalent answer, code every test
    passed; ``code`` for ``synthetic-code``); the RL stage evaluates with its training reward."""


@dataclass
class SFTEvalConfig(EvalConfig):
    """The SFT stage's evaluation: `EvalConfig`, and the engine it samples with (RL's is ``rollout.engine``)."""

    engine: str = choice("hf", "vllm")
    """``hf`` samples the model being trained, in place. ``vllm`` holds a copy of its weights, loaded before each
    evaluation and asleep between them: the engine a real model's long responses need (docs/sft.md)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Options of the ``vllm`` engine, as ``rollout.vllm`` in RL."""


@dataclass
class PromptFormatConfig:
    """How every problem's prompt is put to the model (`klear.data.prompts.PromptFormat`): the RL stage's ``train``
    and ``eval`` problems, the SFT stage's held-out ``eval`` problems (its training rows are rendered by their
    layout)."""

    prompt_template: str = ""
    """What the model is asked, with ``{prompt}`` where each row's prompt goes (a chat prompt's last user turn): an
    instruction the rows lack (DeepScaleR's ``{prompt} Let's think step by step and output the final answer within
    \\boxed{}.``) or, with ``apply_chat_template=false``, a base model's whole prompt; "": each row's prompt as it
    is (docs/data.md#prompt-format)."""
    system_prompt: str = ""
    """A system turn for prompts that have none ("": none)."""
    apply_chat_template: bool = True
    """Render prompts with the tokenizer's chat template; false: the filled ``prompt_template`` is the model's whole
    input (base models, R1-Zero's template), and a row whose prompt has several turns is skipped and counted."""


@dataclass
class SFTDataConfig(PromptFormatConfig):
    train: str | list[str] | dict[str, str] = field(
        default="synthetic", metadata={"example": "[openthoughts.jsonl, limo.jsonl]"}
    )
    """``synthetic`` (the built-in arithmetic task), ``synthetic-code`` (the built-in programming task) or a
    jsonl/json/parquet file (jsonl/json also .gz, .bz2, .xz) or Hugging Face dataset of SFT rows in any published
    layout (``messages``, ShareGPT ``conversations``, TRL's ``text`` and ``prompt``/``completion``, s1K, LIMO,
    OpenMathReasoning, Llama-Nemotron, ``input``/``output``, Alpaca, ...), detected from its first row
    (docs/data-formats.md#sft-layouts). Several sets trained on together, each read in its own layout and reported
    apart (``train/<name>`` in ``data_report.json``): a list of sources, named by their files, or a mapping
    ``{name: source}``."""
    eval: str | list[str] | dict[str, str] = field(
        default="synthetic", metadata={"example": "{aime24: aime24.jsonl, aime25: aime25.jsonl}"}
    )
    """Held-out problems with ``problem`` and ``answer`` fields, ``synthetic`` or ``synthetic-code``; checked by
    ``eval.reward``. Several sets, each scored on its own (``eval/accuracy/<name>``): a list of sources, named by
    their files, or a mapping ``{name: source}``."""
    sft_layout: str = ""
    """The layout of ``data.train`` (``messages``, ``sharegpt``, ``prompt-completion``, ``text``, ``nemotron``,
    ``alpaca``, ``s1k``, ``openmathreasoning``, ``input-output``, ``question-solution``, ``problem-solution``,
    ``prompt-response``); "" detects it from the first row."""
    system_key: str = ""
    """Dotted path of the system prompt, in place of the layout's (``system``, else ``system_prompt``)."""
    prompt_key: str = ""
    """Dotted path of the prompt (text, or a list of messages that are not learned), in place of the layout's."""
    response_key: str = ""
    """Dotted path of the learned response (text, or a list of messages), in place of the layout's."""
    reasoning_key: str = ""
    """Dotted path of the response's reasoning, when the row keeps it apart from the response."""
    thought_markers: str = choice("keep", "think")
    """Bespoke-Stratos' ``<|begin_of_thought|>`` ... ``<|end_of_solution|>`` markers (OpenThoughts-114k, Sky-T1):
    ``keep`` trains them as the text they are; ``think`` makes the thought the turn's reasoning, in the model's
    think tags, and the solution its answer."""
    num_train: int = synthetic_count(4000)
    """Synthetic task: training problems generated."""
    num_eval: int = synthetic_count(200)
    """Synthetic task: held-out problems generated."""
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Synthetic task: difficulty levels mixed in equal parts."""
    plain_fraction: float = within(0.0, 0, 1)
    """Synthetic tasks: share of reference solutions in an output style the verifier rejects, as mixed distilled
    corpora have: the arithmetic task states the final answer without ``\\boxed{}``, the code task prints its
    result with a label (``print("Result:", x)``)."""
    max_length: int = at_least(160, 2)
    """Tokens per training sequence (packed row or single example)."""
    truncation: str = choice("drop", "right")
    """Examples longer than ``max_length``: skip them (``drop``: a cut chain of thought would teach stopping
    mid-reasoning) or keep the first ``max_length`` tokens (``right``); both are counted and logged."""
    batching: str = choice("padded", "grouped", "packed")
    """``padded``: random rows padded to the longest; ``grouped``: similar lengths batched together; ``packed``:
    several examples per row of ``max_length`` (positions restart per example, attention stays inside each)."""
    batch_size: int = at_least(32, 1)
    """Rows per optimizer step."""
    micro_batch_size: int = at_least(0, 0)
    """Rows per forward/backward pass (gradients are accumulated up to ``batch_size``); 0: ``batch_size``."""
    cache_dir: str = ""
    """A folder where each training set is kept tokenized (``sft-<key>.npz``, about 5 bytes a token), keyed by its
    rows, source, settings, tokenizer and klear's data code: a later start with the same key (``--resume``, the
    other ranks of a machine, another run over the same rows) reads it instead of tokenizing again, and ``python -m
    klear.data tokenize`` fills it ahead of a run; "": tokenize at every start
    (docs/sft.md#tokenized-sets-kept-on-disk)."""


@dataclass
class SFTRunConfig:
    stage: str = "sft"
    output_dir: str = "outputs/sft"
    seed: int = seed_field()
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    eval: SFTEvalConfig = field(default_factory=SFTEvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


@dataclass
class RLDataConfig(PromptFormatConfig):
    train: str | list[str] | dict[str, str] = field(
        default="synthetic", metadata={"example": "[gsm8k.parquet, math.parquet]"}
    )
    """``synthetic`` (the built-in arithmetic task), ``synthetic-code`` (the built-in programming task), or a
    jsonl/json/parquet file (jsonl/json also .gz, .bz2, .xz) or Hugging Face dataset of problems with a reference, in
    any published layout (klear's ``problem``/``answer``, verl's ``prompt``/``reward_model``/``data_source``, Klear's
    benchmarks, GSM8K, MATH, LiveCodeBench, ...; docs/data-formats.md), detected from the first row. Rows the reward
    cannot check, or whose prompt is too long, are skipped by file and line and counted. Several sets drawn from as
    one pool, as verl's ``data.train_files`` list, each read in its own layout (``reward/mean/<name>``,
    ``train/<name>`` in ``data_report.json``): a list of sources, named by their files, or a mapping
    ``{name: source}``."""
    eval: str | list[str] | dict[str, str] = field(
        default="synthetic", metadata={"example": "{aime24: aime24.jsonl, aime25: aime25.jsonl}"}
    )
    """Held-out problems scored by ``eval/accuracy``: ``synthetic``, ``synthetic-code`` or a file, as ``train``.
    Several sets, each scored on its own (``eval/accuracy/<name>``; ``eval.num_prompts`` caps each): a list of
    sources, named by their files, or a mapping ``{name: source}``."""
    prompt_key: str = ""
    """Dotted path of the prompt field (``question``, ``prompt``); empty: the detected layout's."""
    reference_key: str = ""
    """Dotted path of the field the reward checks against (``reward_model.ground_truth``, ``meta.answer``): a final
    answer (math) or tests (code); empty: the detected layout's."""
    max_prompt_tokens: int = at_least(0, 0)
    """Longest prompt in tokens (chat template included); longer ones are handled by ``truncation``. 0: the model's
    context (``max_position_embeddings``) minus ``rollout.max_new_tokens`` (``eval.max_new_tokens`` for ``eval``)."""
    truncation: str = choice("skip", "left", "error")
    """Prompts longer than ``max_prompt_tokens``: skipped and counted (``skip``), cut to their last
    ``max_prompt_tokens`` tokens (``left``, the reference recipe's), or the run stops before training naming the
    file and line (``error``)."""
    num_train: int = synthetic_count(4000)
    """Synthetic task: training problems generated."""
    num_eval: int = synthetic_count(200)
    """Synthetic task: held-out problems generated."""
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Synthetic task: difficulty levels mixed in equal parts."""


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """Rollout engine name (``hf``, ``vllm``) or import path; it receives the new weights after every update."""
    prompts_per_step: int = at_least(128, 1)
    """Prompts sampled per RL step (the reference recipe: 128)."""
    group_size: int = at_least(8, 1)
    """Responses per prompt (GRPO's group)."""
    max_new_tokens: int = at_least(32768, 1)
    temperature: float = positive(1.0, why="greedy decoding gives every sample of a group the same response")
    """Sampling temperature, > 0 (greedy decoding would leave every group without reward variance to learn)."""
    top_p: float = within(1.0, 0, 1, open_low=True)
    top_k: int = at_least(0, 0)
    """0: off."""
    batch_size: int = at_least(256, 1)
    """Sequences the engine samples together."""
    old_logprobs: str = choice("engine", "trainer")
    """Behaviour log-probs for the ratio: the engine's sampled-token log-probs, or a no-grad trainer pass."""
    logprob_gap_warn: float = at_least(0.05, 0)
    """Warn when ``rollout/logprob_gap`` (mean |trainer - engine| log-prob) exceeds this."""
    logprob_gap_stop: float = at_least(0.0, 0)
    """Stop the run with an error when ``rollout/logprob_gap`` exceeds this (0: never); checkpoints stay."""
    max_staleness: int = at_least(0, 0)
    """Asynchronous rollouts: a worker process samples the next steps while the trainer updates, and step ``n``
    trains on rollouts sampled from the weights after update ``n - k`` (exactly, so runs stay reproducible).
    0: synchronous, each step samples from the current weights."""
    worker_devices: list[int] = field(default_factory=list)
    """GPUs of the rollout workers (``max_staleness >= 1``), one per local rank, as indices into the trainer's
    visible devices: rollouts on GPUs of their own (disaggregated). Empty: each worker shares its rank's device."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Options of the ``vllm`` engine."""


@dataclass
class RewardConfig:
    name: str = "math"
    """Registered reward name or import path."""
    options: dict[str, Any] = field(default_factory=dict, metadata={"example": "{correct: 1, wrong: -1}"})
    """Keyword options of the reward (e.g. ``correct: 1``, ``wrong: -1`` for Klear's scheme)."""
    num_workers: int = at_least(0, 0)
    """Worker processes scoring in parallel with a per-item deadline; 0 scores in this process."""
    timeout: float = positive(30.0)
    """Per-item deadline of the worker pool (seconds) for a reward without a wall-clock bound of its own; the
    built-in rewards' items get at least their own bound and 10 s (docs/rewards.md)."""
    overlap: bool | None = None
    """With workers and an engine that gives each prompt's samples as they end (``vllm``), score them then, while the
    engine samples the rest, not after the last answer (the same scores); ``None``: when the engine computes on a GPU.
    On a CPU the engine and the sandboxes share the cores, and overlapping them was measured slower
    (docs/rewards.md)."""
    overlong_buffer: int = at_least(0, 0)
    """DAPO soft overlong punishment: penalty from 0 to -1 over the last this-many tokens; 0: off."""
    by_source: dict[str, Any] = field(default_factory=dict, metadata={"example": "{my_set: code}"})
    """Rows whose ``data_source`` (else ``ability``) is this name, or starts with it, are scored by this reward: a
    name or import path, or ``{name: ..., options: {...}}``. Added to the publishers' routes (Klear's
    ``math_longcot_math_verify`` -> math, ``coder1_longcot`` -> code, DAPO's ``math_dapo`` -> math on its
    ``Answer:`` line, rllm's code sources -> code, ...; docs/data-formats.md). ``name`` scores rows without a source;
    ``options`` apply to every route to ``name``."""


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"
    """Advantage estimator: ``grpo`` (group z-score), ``dr_grpo`` (no std), ``rloo`` (leave-one-out)."""
    filter_groups: bool = True
    """Drop groups whose rewards are all equal (zero advantage everywhere; DAPO's dynamic sampling)."""
    oversample: float = within(
        1.0, 1, 64, why="each step samples oversample x rollout.prompts_per_step prompts; the reference recipe: 2"
    )
    """Dynamic sampling's over-sampling: each step samples ``oversample`` x ``rollout.prompts_per_step`` prompts
    (rounded up) and trains on the first ``prompts_per_step`` groups that survive the filter (the reference recipe
    generates 256 for 128: 2.0). 1: sample what is trained on."""
    max_regenerations: int = within(0, 0, 100, why="each is one more sampling round of the step")
    """Extra sampling rounds, on fresh prompts, to refill the batch after filtering; 0: train on what is left."""
    mini_batch_prompts: int = at_least(16, 1)
    """Prompts (x ``group_size`` responses) per optimizer update; the reference recipe: 16 of 128, 8 updates."""
    epochs: int = at_least(1, 1)
    """Passes over the step's rollouts."""
    micro_batch_size: int = at_least(32, 1)
    """Sequences per forward/backward pass (gradients accumulate to a mini-batch); unused when
    ``micro_batch_tokens`` is set."""
    micro_batch_tokens: int = at_least(0, 0)
    """Token budget of one forward/backward pass on one rank (prompt + response tokens): each mini-batch's rows are
    bin-packed into micro-batches of at most this many tokens, computed as one packed sequence without padding,
    and every rank runs the same number of passes with close token loads. A row longer than the budget runs alone
    (with a warning). 0: rows by ``micro_batch_size``, padded."""
    mask_truncated: bool = False
    """Exclude responses cut at ``max_new_tokens`` from the loss."""
    tis_cap: float = at_least(0.0, 0)
    """Truncated importance sampling: weight tokens by min(pi_old_trainer / pi_engine, cap); 0: off."""
    sft_alpha: float = at_least(0.0, 0)
    """Klear's positive-sample SFT loss weight: alpha x NLL of fully correct responses (paper: 0.1)."""
    kl_coef: float = at_least(0.0, 0)
    """KL penalty to the frozen initial policy; 0: off, no reference model is loaded."""
    kl_estimator: str = choice("k3", "k1")
    entropy_coef: float = at_least(0.0, 0)
    """Entropy bonus weight (subtracted from the loss); 0: off."""


@dataclass
class RLRunConfig:
    stage: str = "rl"
    output_dir: str = "outputs/rl"
    seed: int = seed_field()
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="tiny-sft"))
    data: RLDataConfig = field(default_factory=RLDataConfig)
    objective: dict[str, Any] = field(
        default_factory=lambda: {"name": "gppo"}, metadata={"example": "{name: gppo, eps_high: 0.28}"}
    )
    """``name`` (registered or ``package.module:Class``) and the objective's own hyperparameters."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-6, min_lr=1e-6, schedule="constant", warmup_steps=10)
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


SCHEMAS: dict[str, type] = {"sft": SFTRunConfig, "rl": RLRunConfig}
"""Stage name -> the run config dataclass of that stage."""
