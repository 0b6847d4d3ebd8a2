"""Which keys a ``--resume`` sees as changed (`klear.fit._changed_keys`): a key the run's ``config.yaml`` does not hold,
because the klear that wrote it did not have that key yet, is no change while it keeps its default."""

from omegaconf import OmegaConf

from klear.config.load import load_config
from klear.fit import _changed_keys


def written_without(config, section: str, key: str):
    """``config`` as an older klear would have written it: without ``section.key``."""
    old = OmegaConf.create(OmegaConf.to_container(config))
    del OmegaConf.select(old, section)[key]
    return old


def test_a_key_newer_than_the_run_is_no_change_at_its_default():
    config = load_config("configs/rl.yaml", ["model.lora.r=8"])
    old = written_without(config, "rollout.vllm", "lora_adapters")
    assert _changed_keys(old, config) == set()
    changed = load_config("configs/rl.yaml", ["model.lora.r=8", "rollout.vllm.lora_adapters=true"])
    assert _changed_keys(old, changed) == {"rollout.vllm.lora_adapters"}


def test_a_section_newer_than_the_run_is_no_change_until_it_is_set():
    config = load_config("configs/rl.yaml", [])
    old = written_without(config, "model", "lora")
    assert _changed_keys(old, config) == set()
    assert "model.lora.r" in _changed_keys(old, load_config("configs/rl.yaml", ["model.lora.r=8"]))


def test_a_value_that_changed_is_a_change():
    config = load_config("configs/rl.yaml", [])
    assert _changed_keys(config, load_config("configs/rl.yaml", ["optim.lr=0.00031"])) == {"optim.lr"}


def test_a_change_inside_a_resumable_key_is_resumable():
    """``data.eval`` from one source to a mapping of sets changes ``data.eval.<set>`` keys: all of them resumable;
    a key inside another mapping (``reward.options``) is not, nor a key that only starts like a resumable one."""
    from klear.fit import _resumable

    one = load_config("configs/rl.yaml", [])
    sets = load_config("configs/rl.yaml", ["data.eval={arith: synthetic, held_out: eval.jsonl}"])
    changed = _changed_keys(one, sets)
    assert changed == {"data.eval", "data.eval.arith", "data.eval.held_out"} and all(map(_resumable, changed))
    assert _changed_keys(sets, one) == {"data.eval.arith", "data.eval.held_out"}  # data.eval: back at its default
    options = _changed_keys(one, load_config("configs/rl.yaml", ["reward.options={correct: 0.5}"]))
    assert options == {"reward.options.correct"} and not _resumable("reward.options.correct")
    assert not _resumable("data.evaluation") and _resumable("data.train")
