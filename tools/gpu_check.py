"""The CUDA half of ``tools/gpu_check.sh``: a realistic-size Qwen3 built locally, the vLLM engine and packed
log-probs on it.

    python tools/gpu_check.py build DIR     # Qwen3-0.6B's shape (28 layers, width 1024, vocabulary 151,936), random
                                            # weights, the built-in byte tokenizer
    python tools/gpu_check.py vllm DIR      # engine: refresh time, tokens/s, trainer-engine gap, its stream, sleep/wake
    python tools/gpu_check.py packed DIR    # packed rows = padded rows (log-probs, gradients) on CUDA, per kernel

Nothing is downloaded. The vLLM check trains nothing through Lightning: it loads the policy as the RL stage does,
builds the engine through the registry, and prints one ``name: value`` line per measurement. The packed check
asserts: it exits non-zero when packed and padded rows disagree.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from klear.models.tiny import QWEN3_0_6B

SHAPE = {**QWEN3_0_6B, "max_position_embeddings": 4096}


def build(directory: str) -> None:
    from klear.models.tiny import build_tiny

    started = time.perf_counter()
    path = build_tiny(directory, seed=0, **SHAPE)
    print(f"model: {path} built in {time.perf_counter() - started:.1f}s")


def gap(model, rollouts, temperature: float) -> float:
    """Mean |trainer - engine| log-prob over the sampled tokens of ``rollouts``."""
    diffs = []
    for rollout in rollouts:
        ids = torch.tensor([rollout.prompt_ids + rollout.response_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(rollout.prompt_ids) - 1 : -1].float() / temperature
        targets = torch.tensor(rollout.response_ids, device="cuda")[:, None]
        trainer = torch.log_softmax(logits, -1).gather(-1, targets).squeeze(-1).cpu()
        diffs.append((trainer - torch.tensor(rollout.logprobs)).abs())
    return float(torch.cat(diffs).mean())


def check_vllm(directory: str) -> None:
    from klear.config.load import load_config
    from klear.data.prompts import encode_prompt
    from klear.data.synthetic import generate_problems
    from klear.models import load_model, load_tokenizer
    from klear.rollout.engine import ENGINES, SamplingParams

    config = load_config(
        "configs/rl.yaml", [f"model.path={directory}", "rollout.engine=vllm", "trainer.accelerator=gpu"]
    )
    policy, tokenizer = load_model(config.model, on_cuda=True).cuda().eval(), load_tokenizer(config.model)
    started = time.perf_counter()
    engine = ENGINES.get("vllm")(
        policy, tokenizer, model=config.model, rollout=config.rollout, seed=config.seed, precision="bf16-mixed"
    )
    print(f"engine start: {time.perf_counter() - started:.1f}s")
    for attempt in range(2):  # the first refresh pays one-off costs
        torch.cuda.synchronize()
        started = time.perf_counter()
        engine.update_weights(policy.named_parameters())
        print(f"refresh {attempt}: {time.perf_counter() - started:.3f}s")

    problems = generate_problems(64, split="train", seed=0)
    prompts = [encode_prompt(tokenizer, problem["problem"]) for problem in problems]
    sampling = SamplingParams(max_new_tokens=256, temperature=1.0, n=8, seed=0)
    engine.generate(prompts[:4], sampling)  # warm-up
    started = time.perf_counter()
    rollouts = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - started
    tokens = sum(len(rollout.response_ids) for rollout in rollouts)
    print(f"generate: {len(rollouts)} samples, {tokens} tokens in {seconds:.2f}s = {tokens / seconds:.0f} tokens/s")
    print(f"gap bf16 engine vs bf16 trainer: {gap(policy, rollouts[:16], 1.0):.2e}")
    started, first, given = time.perf_counter(), None, {}
    for index, group in engine.stream(prompts, sampling):  # klear.eval's path: each prompt kept as it ends
        first = time.perf_counter() - started if first is None else first
        given[index] = [rollout.response_ids for rollout in group]
    seconds = time.perf_counter() - started
    assert sorted(given) == list(range(len(prompts))), "the stream must give every prompt once"
    same = sum(given[i] == [r.response_ids for r in rollouts[i * 8 : i * 8 + 8]] for i in given) / len(given)
    print(f"stream: first prompt's samples after {first:.2f}s of {seconds:.2f}s, generate's samples for {same:.2f}")
    assert same >= 0.9, f"the stream gave generate's samples for {same:.2f} of the prompts only"

    updated = copy.deepcopy(policy).train()
    optimizer = torch.optim.AdamW(updated.parameters(), lr=1e-4)
    ids = torch.tensor([prompts[0]], device="cuda")
    updated(ids, labels=ids).loss.backward()
    optimizer.step()
    updated.eval()
    probe = SamplingParams(max_new_tokens=64, temperature=1.0, n=2, seed=1)
    print(f"gap before refresh: {gap(updated, engine.generate(prompts[:8], probe), 1.0):.2e}")
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    print(f"sleep freed: {(torch.cuda.mem_get_info()[0] - free_awake) / 2**30:.2f} GiB")
    engine.wake_up()
    started = time.perf_counter()
    engine.update_weights(updated.named_parameters())
    print(f"refresh after wake: {time.perf_counter() - started:.3f}s")
    print(f"gap after refresh: {gap(updated, engine.generate(prompts[:8], probe), 1.0):.2e}")


def check_packed(directory: str) -> None:
    """Token-budget passes run rows packed without padding: on CUDA they must equal padded rows, under klear's
    ``sdpa_gqa`` (one causal call per row) and, when installed, flash-attention's varlen kernel."""
    import importlib.util

    from klear.config import ModelConfig
    from klear.kernels.logprobs import token_logprobs
    from klear.models import load_model

    implementations = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
    lengths = torch.tensor([700, 90, 2100, 350])
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(300, 150_000, (len(lengths), int(lengths.max())), generator=generator).cuda()
    inside = torch.arange(ids.shape[1], device="cuda") < lengths.cuda()[:, None]
    mask = inside & (torch.arange(ids.shape[1], device="cuda") >= 64)
    mask &= torch.arange(ids.shape[1], device="cuda") < lengths.cuda()[:, None] - 1
    targets = torch.roll(ids, -1, 1)
    failed = False
    for implementation in implementations:
        model = load_model(ModelConfig(path=directory, attn_implementation=implementation), on_cuda=True).cuda()
        results = {}
        for pack in (False, True):
            model.zero_grad()
            torch.cuda.synchronize()
            started = time.perf_counter()
            logprobs, _ = token_logprobs(model, ids, targets, mask, attention_mask=inside.long(), pack=pack)
            logprobs.sum().backward()
            torch.cuda.synchronize()
            gradient = model.model.layers[0].self_attn.q_proj.weight.grad.float().clone()
            results[pack] = (logprobs.detach(), gradient, time.perf_counter() - started)
        difference = float((results[True][0] - results[False][0]).abs()[mask].max())
        relative = float((results[True][1] - results[False][1]).norm() / results[False][1].norm())
        print(
            f"packed vs padded, {implementation}, {model.dtype}: max |logprob diff| {difference:.2e}, gradient "
            f"relative diff {relative:.2e}, {results[False][2]:.2f}s padded, {results[True][2]:.2f}s packed"
        )
        failed |= difference > 0.05 or relative > 0.02  # bfloat16 compute: a few ulps of bf16 per token
        del model
    if failed:
        raise SystemExit("packed rows disagree with padded rows on CUDA")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "vllm", "packed"])
    parser.add_argument("directory")
    arguments = parser.parse_args()
    {"build": build, "vllm": check_vllm, "packed": check_packed}[arguments.command](arguments.directory)
