"""Configs: every shipped YAML validates, and bad input stops with one line naming the key and accepted values."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from klear.config.load import ConfigError, load_config
from klear.run.preflight import check_machine

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` in a subprocess

CONFIGS = sorted(str(path) for path in (Path(__file__).parents[2] / "configs").rglob("*.yaml"))


def exact(message: str) -> str:
    """A pattern for the whole of ``message``, for the tests below (which escape parentheses themselves)."""
    return "^" + re.escape(message).replace(r"\(", "(").replace(r"\)", ")") + "$"


@pytest.mark.parametrize("path", CONFIGS)
def test_every_shipped_config_loads_and_validates(path):
    config = load_config(path)
    assert config.stage in ("sft", "rl") and config.trainer.max_steps >= 1


def test_yaml_lists_only_deviations_and_overrides_win(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("stage: sft\ntrainer:\n  max_steps: 7\noptim:\n  lr: 1.0e-4\n")
    config = load_config(path, ["optim.lr=2e-4", "data.levels=[1,2]"])
    assert config.trainer.max_steps == 7 and config.optim.lr == 2e-4 and list(config.data.levels) == [1, 2]
    assert config.optim.min_lr == 4e-5  # untouched default


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.pth=x"], "unknown config key 'model.pth'; accepted keys of section 'model': path, dtype"),
        (["trainer.max_step=3"], "unknown config key 'trainer.max_step'"),
        (["trainer.max_step=3"], "accepted keys of section 'trainer': .*; did you mean 'trainer.max_steps'\\?$"),
        (["optm.lr=1"], "unknown config key 'optm'; accepted keys of stage 'sft': .*; did you mean 'optim'\\?$"),
        (["nonsense=1"], "unknown config key 'nonsense'; accepted keys of stage 'sft': stage, output_dir"),
        (["trainer.max_steps=ten"], "bad value for 'trainer.max_steps'"),
        (["optim.schedule=linear"], "optim.schedule = 'linear' is not accepted; accepted: cosine, constant"),
        (["data.batching=bucketed"], "data.batching = 'bucketed' is not accepted; accepted: padded, grouped, packed"),
        (["trainer.max_steps=0"], exact("trainer.max_steps = 0 is not accepted; accepted: an integer in [1, 2**31)")),
        (["trainer.epochs=-1"], exact("trainer.epochs = -1.0 is not accepted; accepted: a number in [0, 10000]")),
        (["optim.warmup_ratio=1"], exact("optim.warmup_ratio = 1.0 is not accepted; accepted: a number in [0, 1)")),
        (
            ["trainer.epochs=inf"],
            exact("trainer.epochs = inf is not accepted; accepted: a finite number in [0, 10000]"),
        ),
        (["optim.min_lr=1.0"], "optim.min_lr (1.0) must not exceed optim.lr"),
        (["eval.samples=4"], "eval.samples > 1 needs eval.temperature > 0"),
        (["stage=pretrain"], "stage 'pretrain' is not one of"),
        (["trainer.max_steps"], "is not of the form key=value"),
        (["trainer.strategy=fsdp"], "trainer.strategy = 'fsdp' is not accepted; accepted: auto, ddp, fsdp2"),
        (["trainer.strategy=fsdp2", "trainer.precision=bf16-mixed"], "fsdp2 does mixed precision itself"),
        (
            ["trainer.strategy=fsdp2", "model.dtype=bfloat16"],
            exact(
                "model.dtype=bfloat16 with trainer.strategy=fsdp2 would train bfloat16 weight shards, whose AdamW "
                "updates below 1/256 of a weight round away; fsdp2 keeps float32 master weights and computes in "
                "bfloat16 itself: use model.dtype=auto and trainer.precision=auto"
            ),
        ),
        (["trainer.strategy=fsdp2", "trainer.precision=bf16-true"], "^trainer.precision=bf16-true with .*fsdp2"),
        # a mapping where a list belongs, or an item a list's items cannot be (the merge named neither)
        (
            ["optim.betas={a: 1}"],
            exact("optim.betas = {'a': 1} is not accepted; accepted: a list of 2 numbers"),
        ),
        (["optim.betas=[a,b]"], exact("optim.betas = ['a', 'b'] is not accepted; accepted: a list of 2 numbers")),
        (["optim.betas=[[1],2]"], exact("optim.betas = [[1], 2] is not accepted; accepted: a list of 2 numbers")),
        (["optim.betas=5"], exact("optim.betas = 5 is not accepted; accepted: a list of 2 numbers")),
        (["data.levels={a: 1}"], exact("data.levels = {'a': 1} is not accepted; accepted: a list of 1, 2, 3, 4")),
        (["data.levels=[[1]]"], exact("data.levels = [[1]] is not accepted; accepted: a list of 1, 2, 3, 4")),
        (["data.levels=[1.5]"], exact("data.levels = [1.5] is not accepted; accepted: a list of 1, 2, 3, 4")),
        (
            ["model.lora.target_modules={a: 1}"],
            exact("model.lora.target_modules = {'a': 1} is not accepted; accepted: a list of strings"),
        ),
        (
            ["model.rope_scaling=[1]"],
            exact(
                "model.rope_scaling = [1] is not accepted; accepted: a mapping, e.g. {rope_type: yarn, factor: 2.5, "
                "original_max_position_embeddings: 32768}"
            ),
        ),
        # numbers that passed the checks and crashed or hung later
        (
            ["seed=99999999999999999999"],
            exact(
                "seed = 99999999999999999999 is not accepted; accepted: an integer in [-2**63, 2**63) "
                "(torch's generators take 64-bit seeds)"
            ),
        ),
        (
            ["trainer.max_steps=99999999999999999999"],
            exact("trainer.max_steps = 99999999999999999999 is not accepted; accepted: an integer in [1, 2**31)"),
        ),
        (
            ["trainer.devices=99999999999999999999"],
            exact(
                "trainer.devices = 99999999999999999999 is not accepted; accepted: an integer in [1, 1024] "
                "(devices of one node: its GPUs, or CPU processes)"
            ),
        ),
        (
            ["data.num_train=99999999999"],
            exact(
                "data.num_train = 99999999999 is not accepted; accepted: an integer in [1, 1000000] "
                "(the synthetic task generates them all before the first step)"
            ),
        ),
        (
            ["data.num_eval=1000001"],
            exact(
                "data.num_eval = 1000001 is not accepted; accepted: an integer in [1, 1000000] "
                "(the synthetic task generates them all before the first step)"
            ),
        ),
        (
            ["optim.lr=1" + "0" * 400],
            exact(f"optim.lr = 1{'0' * 400} is not accepted; accepted: a finite number > 0"),
        ),
    ],
)
def test_bad_configs_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listed)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klear.fit", *args], capture_output=True, text=True, timeout=120)


def test_cli_prints_the_resolved_config():
    result = run_cli("--config", "configs/sft.yaml", "--print-config", "trainer.max_steps=9")
    assert result.returncode == 0, result.stderr
    printed = OmegaConf.create(result.stdout)
    assert printed.stage == "sft" and printed.trainer.max_steps == 9 and printed.optim.lr == 2e-3  # from the YAML
    assert printed.optim.betas == [0.9, 0.95]  # a default


def test_a_typo_without_a_close_key_gets_no_suggestion():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["nonsense=1"])
    assert "did you mean" not in str(error.value)


def test_cli_error_is_one_line_and_exit_code_2(tmp_path):
    result = run_cli("--config", "configs/sft.yaml", "model.pth=x", f"output_dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown config key 'model.pth'; accepted keys of section 'model': path, dtype, "
        "gradient_checkpointing, attn_implementation, rope_scaling, lora; did you mean 'model.path'?"
    ]
    assert not (tmp_path / "config.yaml").exists()  # nothing was started


def test_cli_unreadable_data_file_is_one_line(tmp_path):
    result = run_cli("--config", "configs/sft.yaml", f"data.train={tmp_path}/missing.jsonl", f"output_dir={tmp_path}/o")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing.jsonl" in lines[0], result.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["objective.eps_hgh=0.3"], "objective 'gppo' has no hyperparameter 'eps_hgh'; accepted: eps_low, eps_high"),
        (["objective.eps_hgh=0.3"], "accepted: eps_low, .*, loss_agg; did you mean 'eps_high'\\?$"),
        (["rollout.tempreature=0.5"], "unknown config key 'rollout.tempreature'; accepted keys of section 'rollout'"),
        (["trainer.epochs=2"], "unknown config key 'trainer.epochs'; accepted keys of section 'trainer': max_steps, "),
        (["rollout.tempreature=0.5"], "; did you mean 'rollout.temperature'\\?$"),
        (["reward.options.timout=3"], "reward 'math' has no option 'timout'; .*; did you mean 'timeout'\\?$"),
        (["objective.name=gpo"], "unknown objective 'gpo'; registered: cispo, clip-cov, dapo, dapo-erc, dppo-kl, "),
        (["objective.dual_clip=0.5"], "dual_clip must be > 1"),
        (["reward.name=maths"], "unknown reward 'maths'"),
        (["algorithm.advantage=ppo"], "unknown advantage estimator 'ppo'; registered: dr_grpo, grpo, rloo"),
        (["rollout.engine=sglang"], "unknown rollout engine 'sglang'"),
        (["rollout.group_size=1"], "rollout.group_size must be >= 2"),
        (["algorithm.tis_cap=2.0"], "algorithm.tis_cap needs rollout.old_logprobs=trainer"),
        (["reward.overlap=true"], "reward.overlap=true needs reward.num_workers >= 1"),
        (
            ["objective.name=gspo", "algorithm.tis_cap=2.0", "rollout.old_logprobs=trainer"],
            "algorithm.tis_cap = 2.0 weights each token's advantage, which objective 'gspo' (one ratio per sequence)",
        ),
        (["rollout.old_logprobs=both"], "rollout.old_logprobs = 'both' is not accepted; accepted: engine, trainer"),
        (["rollout.max_staleness=-1"], "rollout.max_staleness = -1 is not accepted; accepted: an integer >= 0"),
        (["rollout.worker_devices=[1]"], "rollout.worker_devices places rollout workers, which need rollout.max_st"),
        (
            ["rollout.worker_devices=[1]", "rollout.max_staleness=1", "trainer.accelerator=cpu"],
            "rollout.worker_devices names GPUs: set trainer.accelerator=gpu",
        ),
        (
            ["rollout.worker_devices=[-1]", "rollout.max_staleness=1", "trainer.accelerator=gpu"],
            r"rollout.worker_devices = \[-1\]: GPU indices are >= 0",
        ),
        (["rollout.prompts_per_step=0"], "rollout.prompts_per_step = 0 is not accepted; accepted: an integer >= 1"),
        (["reward.by_source.my_set=maths"], "reward.by_source.my_set: unknown reward 'maths'"),
        (["reward.by_source.my_set={reward: math}"], "reward.by_source.my_set: a route is a reward name or"),
        (
            ["reward.by_source.my_set={name: math, options: {extract: last}}"],
            "reward.by_source.my_set: reward 'math': unknown extract 'last'; accepted: boxed, answer_line",
        ),
        (["reward.by_source.my_set={name: code, options: {hrad: true}}"], "reward 'code' has no option 'hrad'"),
        (["data.truncation=right"], "data.truncation = 'right' is not accepted; accepted: skip, left, error"),
        (["algorithm.oversample=0.5"], "algorithm.oversample = 0.5 is not accepted; accepted: a number in \\[1, 64\\]"),
        (
            ["model.rope_scaling={factor: 2}"],
            "model.rope_scaling = {'factor': 2} is not accepted; accepted: empty, or a",
        ),
        # a list where a mapping belongs, or a mapping where a list belongs
        (
            ["reward.by_source=[1]"],
            exact("reward.by_source = [1] is not accepted; accepted: a mapping, e.g. {my_set: code}"),
        ),
        (
            ["reward.options=[1]"],
            exact("reward.options = [1] is not accepted; accepted: a mapping, e.g. {correct: 1, wrong: -1}"),
        ),
        (
            ["objective=[1]"],
            exact("objective = [1] is not accepted; accepted: a mapping, e.g. {name: gppo, eps_high: 0.28}"),
        ),
        (
            ["rollout.worker_devices={a: 1}"],
            exact("rollout.worker_devices = {'a': 1} is not accepted; accepted: a list of integers"),
        ),
        (
            ["rollout.worker_devices=[[1]]"],
            exact("rollout.worker_devices = [[1]] is not accepted; accepted: a list of integers"),
        ),
        # numbers that passed the checks and crashed or hung later
        (
            ["algorithm.oversample=1e308"],
            exact(
                "algorithm.oversample = 1e+308 is not accepted; accepted: a number in [1, 64] (each step samples "
                "oversample x rollout.prompts_per_step prompts; the reference recipe: 2)"
            ),
        ),
        (
            ["algorithm.max_regenerations=99999999999999999999"],
            exact(
                "algorithm.max_regenerations = 99999999999999999999 is not accepted; accepted: an integer in "
                "[0, 100] (each is one more sampling round of the step)"
            ),
        ),
        (
            ["seed=-99999999999999999999"],
            exact(
                "seed = -99999999999999999999 is not accepted; accepted: an integer in [-2**63, 2**63) "
                "(torch's generators take 64-bit seeds)"
            ),
        ),
        (
            ["data.num_train=99999999999"],
            "data.num_train = 99999999999 is not accepted; accepted: an integer in \\[1, 1000000\\]",
        ),
        (
            ["model.rope_scaling={rope_type: yarn, factor: .inf}"],
            exact("model.rope_scaling.factor = inf is not accepted; accepted: a finite number > 0"),
        ),
        (
            ["model.rope_scaling={rope_type: yarn, factor: .nan}"],
            exact("model.rope_scaling.factor = nan is not accepted; accepted: a finite number > 0"),
        ),
        (
            ["model.rope_scaling={rope_type: bogus, factor: 2}"],
            exact(
                "model.rope_scaling.rope_type = 'bogus' is not accepted; accepted: default, linear, dynamic, yarn, "
                "longrope, llama3, proportional"
            ),
        ),
        (
            ["model.rope_scaling={type: yarm, factor: 2}"],
            "model.rope_scaling.type = 'yarm' is not accepted; .*; did you mean 'yarn'\\?$",
        ),
        (
            ["model.rope_scaling={rope_type: yarn}"],
            exact(
                "model.rope_scaling = {'rope_type': 'yarn'} is not accepted; accepted: empty, or a rope_type "
                "(default, linear, dynamic, yarn, longrope, llama3, proportional) with a factor > 0, e.g. "
                "{rope_type: yarn, factor: 2.5, original_max_position_embeddings: 32768}"
            ),
        ),
        (
            ["model.rope_scaling={rope_type: yarn, factor: 2, original_max_position_embeddings: 0}"],
            "model.rope_scaling.original_max_position_embeddings = 0 is not accepted; accepted: an integer >= 1",
        ),
    ],
)
def test_bad_rl_configs_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config("configs/rl.yaml", overrides)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("optim: {betas: {a: 1}}", "optim.betas = {'a': 1} is not accepted; accepted: a list of 2 numbers"),
        ("objective: [1]", "objective = [1] is not accepted; accepted: a mapping, e.g. {name: gppo, eps_high: 0.28}"),
        ("reward: {options: [1]}", "reward.options = [1] is not accepted; accepted: a mapping, e.g. {correct: 1, "),
        (
            "data:\n  levels: ${model}",
            "data.levels = '${model}' cannot be resolved: Invalid value assigned: dict is not a ListConfig",
        ),
        ("data: {levels: [1, '${nope}']}", "data.levels[1] = '${nope}' cannot be resolved: Interpolation key 'nope'"),
    ],
)
def test_bad_yaml_files_name_the_key(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(f"stage: rl\n{text}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value).startswith(message)


def test_bad_shapes_are_one_line_on_the_command_line():
    result = run_cli("--config", "configs/rl.yaml", "--print-config", "objective=[1]")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: objective = [1] is not accepted; accepted: a mapping, e.g. {name: gppo, eps_high: 0.28}"
    ]


def test_values_at_the_bounds_stay_accepted():
    config = load_config(
        "configs/rl.yaml",
        [
            "seed=-1",
            "optim.betas=['0.9', 0.95]",  # quoted numbers, as the merge converts them
            "data.levels=[1, '${trainer.num_nodes}']",
            "trainer.max_steps=2147483647",
            "trainer.devices=1024",
            "algorithm.oversample=64",
            "algorithm.max_regenerations=100",
            "data.num_train=1000000",
            "model.rope_scaling={type: linear, factor: 2, original_max_position_embeddings: 4096}",
        ],
    )
    assert config.seed == -1 and list(config.optim.betas) == [0.9, 0.95] and list(config.data.levels) == [1, 1]
    assert config.algorithm.oversample == 64 and config.model.rope_scaling.type == "linear"
    for seed in (-(2**63), 2**63 - 1):
        assert load_config("configs/sft.yaml", [f"seed={seed}"]).seed == seed


@pytest.mark.parametrize("bfloat16", ["model.dtype=bfloat16", "trainer.precision=bf16-true"])
def test_fsdp2_takes_a_bfloat16_base_under_lora(bfloat16):
    """Frozen base weights may be bfloat16 under fsdp2: only the float32 adapters are trained."""
    config = load_config("configs/rl.yaml", ["trainer.strategy=fsdp2", bfloat16, "model.lora.r=8"])
    assert config.model.lora.r == 8


def test_rope_types_are_those_transformers_knows():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from klear.config.load import ROPE_TYPES

    assert set(ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}


def test_objective_flag_selects_any_registered_objective_or_import_path():
    assert load_config("configs/rl.yaml", objective="cispo").objective.name == "cispo"
    path = "tests.objectives.test_user_objective:SoftClip"
    assert load_config("configs/rl.yaml", ["objective.sharpness=2.0"], objective=path).objective.sharpness == 2.0
    with pytest.raises(ConfigError, match="applies to stages with an objective section"):
        load_config("configs/sft.yaml", objective="gppo")


def test_optional_loggers_need_their_package():

    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ConfigError, match="needs the wandb package"):
            load_config("configs/sft.yaml", ["logging.wandb=true"])
    else:
        assert load_config("configs/sft.yaml", ["logging.wandb=true"]).logging.wandb


def test_vllm_engine_without_vllm_installed_names_the_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    # A property of the machine, found before the run writes anything (`klear.run.preflight`); the config loads, so
    # `klear.data tokenize` fills an SFT run's cache on a machine without vLLM.
    with pytest.raises(ConfigError, match=r"rollout\.engine=vllm needs vLLM: pip install -e '\.\[vllm\]'"):
        check_machine(load_config("configs/rl.yaml", ["rollout.engine=vllm"]))
    with pytest.raises(ConfigError, match=r"eval\.engine=vllm needs vLLM: pip install -e '\.\[vllm\]'"):
        check_machine(load_config("configs/sft.yaml", ["eval.engine=vllm"]))
    assert load_config("configs/sft_qwen3_8b.yaml").eval.engine == "vllm"
