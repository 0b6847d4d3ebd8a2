"""The vLLM engine under data-parallel training: one engine per rank (vLLM's ``external_launcher``), on CPU with
gloo. Every run is the real CLI in a subprocess (Lightning launches the second rank by re-running it), the
one-process baseline too, so no vLLM state is left in the pytest process. Skipped without vllm.
"""

import json

import pytest
from omegaconf import OmegaConf

from klear.config.load import load_config
from klear.models import load_model, load_tokenizer

pytest.importorskip("vllm")

from klear.rollout import vllm_engine  # after the skip: it imports vllm
from tests.runs import RL_SHORT, assert_same_metrics, assert_same_weights, fit_in_subprocess, read_metrics

pytestmark = pytest.mark.end_to_end  # runs two ranks of the CLI in subprocesses

RL = [
    "--config",
    "configs/rl.yaml",
    *RL_SHORT,
    "rollout.engine=vllm",
    # 3 prompts over 2 ranks: uneven shares (rank 1 samples one prompt), and a refill of fewer prompts than
    # ranks when a group has nothing to learn (rank 1 then samples none and does not call its engine).
    "rollout.prompts_per_step=3",
    "algorithm.max_regenerations=1",
    "rollout.old_logprobs=trainer",
    "algorithm.mini_batch_prompts=3",
    "algorithm.micro_batch_size=4",
    "algorithm.epochs=2",
    "algorithm.sft_alpha=0.1",
    "algorithm.kl_coef=0.01",
    "eval.num_prompts=5",
    "data.num_eval=5",
]
"""``RL_SHORT`` (later overrides win) on the vLLM engine, with uneven shares over two ranks."""
TOL = 1e-4  # float32 trainer and engine agree to ~1e-6


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    output = tmp_path_factory.mktemp("vllm-one")
    fit_in_subprocess([*RL, f"output_dir={output}"])
    return output


# ddp with the vLLM engine stays in the default suite through the asynchronous test below.
@pytest.mark.slow  # two ranks of vLLM engines; the default run keeps one process's engine and two hf ranks
@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_two_ranks_with_an_engine_each_match_one_process(one_process, tmp_path, strategy):
    fit_in_subprocess([*RL, f"trainer.strategy={strategy}", "trainer.devices=2", f"output_dir={tmp_path}"])
    two = read_metrics(tmp_path / "metrics.csv")
    assert [row["step"] for row in two] == ["0", "1", "2", "3", "4"]
    # Each rank's engine got the full gathered weights after every update: it agrees with the trainer.
    gaps = [float(row["rollout/logprob_gap"]) for row in two[:4] if row["rollout/logprob_gap"]]
    assert gaps and max(gaps) < TOL, gaps
    # Prompt i of a step is sampled from seed + i whichever rank samples it: the same samples, rewards,
    # evaluation and updates as one engine on all prompts.
    assert_same_metrics(one_process, tmp_path)
    assert_same_weights(one_process, tmp_path)


def test_tensor_parallel_engines_across_training_ranks_are_refused(monkeypatch):
    config = load_config(
        "configs/rl.yaml", ["model.path=tiny", "rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2"]
    )
    monkeypatch.setattr(vllm_engine, "_training_ranks", lambda: 2)
    policy, tokenizer = load_model(config.model), load_tokenizer(config.model)
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1, got 2"):
        vllm_engine.build_vllm_engine(policy, tokenizer, model=config.model, rollout=config.rollout)


@pytest.fixture(scope="module")
def async_one_process(tmp_path_factory):
    output = tmp_path_factory.mktemp("vllm-async-one")
    fit_in_subprocess([*RL, "rollout.max_staleness=1", f"output_dir={output}"])
    return output


@pytest.mark.slow  # the default run keeps asynchronous rollouts with the hf engine
def test_async_rollouts_with_the_vllm_engine(async_one_process, tmp_path):
    """The vLLM engine in the rollout worker process, one step ahead: its log-probs agree with the weights that
    sampled (the worker's copy, loaded from the same push), and two ranks' workers (their own gloo group, vLLM's
    external launcher inside it) sample what one worker samples."""
    rows = read_metrics(async_one_process / "metrics.csv")
    assert [float(row["rollout/staleness"]) for row in rows[:4]] == [0.0, 1.0, 1.0, 1.0]
    gaps = [float(row["rollout/logprob_gap"]) for row in rows[:4] if row["rollout/logprob_gap"]]
    assert gaps and max(gaps) < TOL, gaps
    fit_in_subprocess(
        [*RL, "rollout.max_staleness=1", "trainer.strategy=ddp", "trainer.devices=2", f"output_dir={tmp_path}"]
    )
    assert_same_metrics(async_one_process, tmp_path)


@pytest.mark.slow
def test_sft_under_fsdp2_evaluates_on_an_engine_per_rank(tmp_path):
    """SFT on 2 ``fsdp2`` ranks with ``eval.engine=vllm``: each rank's engine is loaded with the gathered weights
    before each evaluation, and the greedy answers are those of the ``hf`` engine sampling the sharded model."""
    sft = ["--config", "configs/sft.yaml", "model.path=tiny-sft", "data.num_train=64", "data.plain_fraction=1.0"]
    sft += ["data.batch_size=8", "trainer.max_steps=4", "optim.lr=3e-3", "optim.warmup_steps=0", "eval.every_n_steps=2"]
    sft += ["eval.num_prompts=16", "eval.temperature=0", "eval.samples=1", "trainer.progress_bar=false"]
    sft += ["trainer.devices=2", "trainer.strategy=fsdp2", "trainer.accelerator=cpu"]
    answers = {}
    for engine in ("hf", "vllm"):
        fit_in_subprocess([*sft, f"output_dir={tmp_path / engine}", f"eval.engine={engine}"])
        lines = (tmp_path / engine / "samples.jsonl").read_text().splitlines()
        answers[engine] = [(line["step"], line["samples"]) for line in map(json.loads, lines)]
    assert answers["vllm"] == answers["hf"] and [step for step, _ in answers["hf"]] == [0, 0, 2, 2, 4, 4]


@pytest.mark.slow
def test_the_8b_sft_recipe_runs_at_tiny_scale_on_two_ranks(tmp_path):
    """``configs/sft_qwen3_8b.yaml`` as it is, with only the model, the data and the sizes made tiny and the CPU for
    the GPUs: packed rows by passes (trainer.epochs) with the warmup a share of them, FSDP2 over 2 ranks, the
    tokenized set kept in data.cache_dir, the held-out sets scored apart by a vLLM engine per rank."""
    tiny = ["model.path=tiny-sft", "data.train=synthetic", "data.num_train=256", "data.max_length=512"]
    tiny += ["data.batch_size=4", "data.eval={aime24: synthetic, aime25: synthetic}", "data.num_eval=8"]
    tiny += ["eval.max_new_tokens=96", "eval.num_prompts=8", "eval.batch_size=8", "eval.every_n_steps=10"]
    tiny += ["trainer.checkpoint_every_n_steps=10", "trainer.accelerator=cpu", "trainer.devices=2"]
    tiny += [f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={tmp_path / 'run'}", "trainer.progress_bar=false"]
    log = fit_in_subprocess(["--config", "configs/sft_qwen3_8b.yaml", *tiny])
    [line] = [line for line in log.splitlines() if "trainer.epochs = 2: " in line]
    steps = int(line.split("trainer.epochs = 2: ")[1].split(" steps")[0])
    assert OmegaConf.load(tmp_path / "run" / "config.yaml").trainer.max_steps == steps
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    scored = [int(row["step"]) for row in rows if row.get("eval/accuracy/aime24")]
    assert scored == [*range(0, steps, 10), steps] and all(
        row.get("eval/accuracy/aime25") for row in rows if row.get("eval/accuracy/aime24")
    )
    assert len(list((tmp_path / "cache").glob("sft-*.npz"))) == 1
