#!/usr/bin/env bash
# The checks that need a CUDA GPU; nothing is downloaded. Run from anywhere, on a machine with klear installed
# with the GPU extra (pip install torch==2.13.0 && pip install -e ".[dev,vllm]"):
#
#   bash tools/gpu_check.sh [WORKDIR]     # ~5-8 minutes on one H100-class GPU; WORKDIR defaults to a temp dir
#
# 1. builds a Qwen3-0.6B-shaped model (random weights, the built-in tokenizer), checks that packed rows equal padded
#    rows on CUDA, and runs the vLLM engine on it: refresh time, tokens/s, trainer-engine log-prob gap before and
#    after a refresh, sleep/wake;
# 2. AdamW on bfloat16 weights through float32 masters with CUDA's fused kernel (tools/bench_master_weights.py
#    asserts the masters equal a float32 run bit for bit), and a short RL run on one GPU without FSDP2, where the
#    policy's weights are bfloat16 (model.dtype: auto) and stepped through those masters; it asserts the gap below
#    0.05;
# 3. short RL runs through the CLI with FSDP2 on CUDA (the embedding and head sharded by vocabulary rows): the hf
#    engine (rows, then a token budget), the vllm engine, and the vllm engine serving a LoRA policy's adapters (the
#    GPU's default); each asserts a trainer-engine gap below 0.05;
# 4. asynchronous rollouts (rollout.max_staleness=1) with the vllm engine in its worker process, on the training GPU
#    and, when there are two GPUs, on a GPU of its own (rollout.worker_devices=[1]); each asserts the staleness
#    schedule, a gap below 0.05 against the weights that sampled, and the trainer's and engine's idle times;
# 5. SFT with FSDP2 on CUDA evaluated greedily by the hf engine and by the vllm engine (eval.engine=vllm, loaded with
#    the trained weights before each evaluation): it asserts that at every evaluation most answers are the same
#    (bfloat16 kernels differ) and that the trained model's answers differ from the starting model's;
# 6. klear.eval of that trained model with each engine, greedy (--engine vllm with --vllm gpu_memory_utilization,
#    the model left in the host's memory and its weights loaded into vLLM): it asserts most answers are the same.
# 7. klear.eval on the built-in code task with vllm and 8 reward workers, scoring each problem as it ends against
#    scoring after the engine (tools/bench_overlap_scoring.py): it asserts that a sample drawn alike is scored alike
#    and prints the ratio of their sampling + scoring seconds, the overlap's gain on a GPU.
# Exits non-zero if a step failed or vllm is missing (the other steps still run).
set -uo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
status=0
step() { echo "== $*"; "$@" && return 0; echo "FAILED: $*"; status=1; return 1; }
summary() {  # eval accuracy (first, last), mean and max logprob gap, mean rollout seconds of a run's metrics.csv
    python - "$1" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
column = lambda key: [float(row[key]) for row in rows if row.get(key)]
gaps, accuracy, rollout = column("rollout/logprob_gap"), column("eval/accuracy"), column("timing/rollout_s")
print(f"{sys.argv[1]}: eval/accuracy {accuracy[0]:.3f} -> {accuracy[-1]:.3f}, logprob_gap mean {sum(gaps) / len(gaps):.2e}"
      f" max {max(gaps):.2e}, rollout {sum(rollout) / len(rollout):.2f}s/step")
# bfloat16 compute: the engine and the trainer agree to a few 1e-3 (a stale or broken engine shows 1e-1 and more).
assert len(rows) >= 4 and max(gaps) < 0.05, gaps
EOF
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || exit 1
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
step python tools/gpu_check.py build "$work/qwen3-0.6b"
step python tools/gpu_check.py packed "$work/qwen3-0.6b"
if python -c "import vllm; print('vllm', vllm.__version__)"; then
    step python tools/gpu_check.py vllm "$work/qwen3-0.6b"
else
    echo "SKIPPED: vllm is not installed (pip install -e '.[vllm]')"; status=1
fi

short=(--config configs/rl.yaml trainer.accelerator=gpu trainer.strategy=fsdp2 trainer.max_steps=4
       trainer.progress_bar=false eval.every_n_steps=0 eval.num_prompts=48 eval.samples=2)
step python tools/bench_master_weights.py --device cuda
step python -m klear.fit --config configs/rl.yaml trainer.accelerator=gpu trainer.max_steps=4 trainer.progress_bar=false \
    eval.every_n_steps=0 eval.num_prompts=48 eval.samples=2 output_dir="$work/rl-one-gpu" \
    && step summary "$work/rl-one-gpu/metrics.csv"
step python -m klear.fit "${short[@]}" output_dir="$work/rl-fsdp2-hf" && step summary "$work/rl-fsdp2-hf/metrics.csv"
step python -m klear.fit "${short[@]}" algorithm.micro_batch_tokens=2048 output_dir="$work/rl-fsdp2-tokens" \
    && step summary "$work/rl-fsdp2-tokens/metrics.csv"
if python -c "import vllm" 2>/dev/null; then
    step python -m klear.fit "${short[@]}" rollout.engine=vllm output_dir="$work/rl-fsdp2-vllm" \
        && step summary "$work/rl-fsdp2-vllm/metrics.csv"
    # LoRA: on GPU the engine serves the adapters themselves, a new version after every wake-up; a large learning
    # rate moves them far from the base, so an engine that dropped them across sleep and wake shows a large gap.
    step python -m klear.fit "${short[@]}" rollout.engine=vllm model.lora.r=8 optim.lr=1e-2 \
        output_dir="$work/rl-fsdp2-vllm-lora" 2> >(tee "$work/rl-fsdp2-vllm-lora.log" >&2) \
        && step grep -q "the vllm engine serves the adapters themselves" "$work/rl-fsdp2-vllm-lora.log" \
        && step summary "$work/rl-fsdp2-vllm-lora/metrics.csv"
fi
async_asserts() {  # an asynchronous run's metrics.csv: the schedule, the gap, the idle times logged
    python - "$1" <<'EOF'
import csv, sys
rows = [row for row in csv.DictReader(open(sys.argv[1])) if row.get("reward/mean")]
staleness = [float(row["rollout/staleness"]) for row in rows]
assert staleness == [min(step, 1) for step in range(len(rows))], staleness
gaps = [float(row["rollout/logprob_gap"]) for row in rows if row.get("rollout/logprob_gap")]
assert gaps and max(gaps) < 0.05, gaps
waits = [(float(row["timing/trainer_wait_s"]), float(row["timing/engine_wait_s"])) for row in rows]
print(f"{sys.argv[1]}: staleness {staleness}, gap max {max(gaps):.2e}, trainer/engine wait per step {waits}")
EOF
}
if python -c "import vllm" 2>/dev/null; then
    step python -m klear.fit "${short[@]}" rollout.engine=vllm rollout.max_staleness=1 output_dir="$work/rl-async-vllm" \
        && step async_asserts "$work/rl-async-vllm/metrics.csv"
    if [ "$(nvidia-smi --list-gpus | wc -l)" -ge 2 ]; then
        step python -m klear.fit "${short[@]}" rollout.engine=vllm rollout.max_staleness=1 'rollout.worker_devices=[1]' \
            output_dir="$work/rl-async-vllm-own-gpu" && step async_asserts "$work/rl-async-vllm-own-gpu/metrics.csv"
    else
        echo "SKIPPED: one GPU, so no disaggregated rollout worker (rollout.worker_devices=[1])"
    fi
fi
same_answers() {  # two SFT runs' samples.jsonl: the same greedy answers at each evaluation, which training changed
    python - "$1" "$2" <<'EOF'
import json, sys
runs = [[json.loads(line) for line in open(f"{folder}/samples.jsonl")] for folder in sys.argv[1:]]
texts = [{} for _ in runs]
for run, by_step in zip(runs, texts):
    for line in run:
        by_step.setdefault(line["step"], []).append(line["samples"][0]["text"])
steps = sorted(texts[0])
shares = {step: sum(a == b for a, b in zip(texts[0][step], texts[1][step])) / len(texts[0][step]) for step in steps}
moved = sum(a != b for a, b in zip(texts[1][steps[0]], texts[1][steps[-1]])) / len(texts[1][steps[0]])
print(f"same greedy answers by step {shares}; answers changed by training: {moved:.2f}")
assert texts[0].keys() == texts[1].keys() and min(shares.values()) >= 0.8 and moved >= 0.5, (shares, moved)
EOF
}
sft=(--config configs/sft.yaml model.path=tiny-sft trainer.accelerator=gpu trainer.strategy=fsdp2 data.num_train=256
     data.plain_fraction=1.0 data.batch_size=16 trainer.max_steps=6 optim.lr=3e-3 optim.warmup_steps=0
     eval.every_n_steps=3 eval.num_prompts=32 eval.temperature=0 eval.samples=1 logging.samples=32
     trainer.progress_bar=false)
if python -c "import vllm" 2>/dev/null; then
    step python -m klear.fit "${sft[@]}" eval.engine=hf output_dir="$work/sft-eval-hf" \
        && step python -m klear.fit "${sft[@]}" eval.engine=vllm output_dir="$work/sft-eval-vllm" \
        && step same_answers "$work/sft-eval-hf" "$work/sft-eval-vllm"
fi
same_eval_answers() {  # two klear.eval outputs: the same greedy answer to most problems
    python - "$1" "$2" <<'EOF'
import json, sys
texts = [[json.loads(line)["samples"][0]["text"] for line in open(f"{folder}/results.jsonl")] for folder in sys.argv[1:]]
share = sum(a == b for a, b in zip(*texts)) / len(texts[0])
print(f"klear.eval, hf and vllm engines: the same greedy answer to {share:.2f} of {len(texts[0])} problems")
assert len(texts[0]) == len(texts[1]) == 32 and share >= 0.8, share
EOF
}
if python -c "import vllm" 2>/dev/null && [ -f "$work/sft-eval-vllm/hf/config.json" ]; then
    python -m klear.data synthetic --split eval --num 32 --out "$work/eval.jsonl"
    evaluation=(--model "$work/sft-eval-vllm/hf" --data "$work/eval.jsonl" --k 1 --temperature 0 --max-new-tokens 96)
    step python -m klear.eval "${evaluation[@]}" --engine hf --output "$work/eval-hf" \
        && step python -m klear.eval "${evaluation[@]}" --engine vllm --vllm gpu_memory_utilization=0.6 \
            --output "$work/eval-vllm" \
        && step same_eval_answers "$work/eval-hf" "$work/eval-vllm"
fi
if python -c "import vllm" 2>/dev/null; then  # the engine runs several times in one process: a share of the GPU each
    step python tools/bench_overlap_scoring.py --num-workers 8 --rounds 2 --vllm gpu_memory_utilization=0.3
fi
echo "work directory: $work"
exit $status
