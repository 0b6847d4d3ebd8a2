"""``--help-config``: every key of a resolved config, with its type, its value, the stage's dataclass default and
the first sentence of the docstring under the field, read from the source; the table's layouts."""

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from klear.config import SCHEMAS, OptimConfig, RolloutConfig, VLLMConfig
from klear.config.help import KeyHelp, args_section, config_help, field_docs, first_sentence, format_table, key_help
from klear.config.load import ConfigError, load_config
from klear.objectives import GPPO
from tests.config.test_config import CONFIGS

pytestmark = pytest.mark.end_to_end  # runs `--help-config` in a subprocess

GPPO_OWN = ("beta_low", "beta_high", "dual_clip")
"""GPPO's hyperparameters beyond PolicyObjective's."""


def leaf_keys(node, rows, prefix=""):
    """Dotted keys of a config's values; a mapping that is a key's value (``reward.options``, ``data.eval``'s sets) is
    that one key (one of ``rows``)."""
    if isinstance(node, dict) and prefix[:-1] not in rows:
        return [key for name, value in node.items() for key in leaf_keys(value, rows, f"{prefix}{name}.")]
    return [prefix[:-1]]


@pytest.mark.parametrize("path", CONFIGS)
def test_every_key_of_every_shipped_config_has_one_row(path):
    config = load_config(path)
    keys = [row.key for row in key_help(config)]
    assert len(keys) == len(set(keys))
    assert set(leaf_keys(OmegaConf.to_container(config), set(keys))) <= set(keys)
    assert all(row.type for row in key_help(config))


def test_values_are_the_configs_and_defaults_the_stages_dataclass():
    rows = {row.key: row for row in key_help(load_config("configs/rl.yaml", ["rollout.top_k=5", "data.levels=[1,2]"]))}
    assert (rows["rollout.top_k"].value, rows["rollout.top_k"].default) == ("5", "0")
    assert (rows["rollout.batch_size"].value, rows["rollout.batch_size"].default) == ("128", "256")  # from the YAML
    assert rows["model.path"].default == "tiny-sft"  # RLRunConfig's default, not ModelConfig's "tiny"
    assert rows["optim.lr"].default == "1e-06"
    assert rows["data.levels"].value == "[1, 2]" and rows["reward.options"].value == "{}"
    assert rows["rollout.vllm.enforce_eager"].value == "null" and rows["rollout.vllm.enable_sleep_mode"].value == "true"


def test_types_name_what_is_accepted():
    rows = {row.key: row for row in key_help(load_config("configs/rl.yaml"))}
    assert rows["trainer.max_steps"].type == "int in [1, 2**31)"
    assert rows["rollout.top_p"].type == "float in (0, 1]"
    assert rows["trainer.strategy"].type == "str: auto|ddp|fsdp2"
    assert rows["rollout.vllm.enforce_eager"].type == "bool | None"
    assert rows["optim.betas"].type == "tuple[float, float]"


def test_docs_are_the_first_sentence_under_each_field():
    docs = field_docs(RolloutConfig)
    assert docs["temperature"] == (
        "Sampling temperature, > 0 (greedy decoding would leave every group without reward variance to learn)."
    )
    assert docs["vllm"] == "Options of the vllm engine."  # ``vllm`` markup removed
    assert field_docs(VLLMConfig)["kv_cache_memory_bytes"] == "KV cache size in bytes."
    assert "weight_decay" not in field_docs(OptimConfig)  # no docstring: the row's doc is empty
    rows = {row.key: row for row in key_help(load_config("configs/rl.yaml"))}
    assert rows["optim.weight_decay"].doc == ""
    undocumented = {field.name for field in dataclasses.fields(RolloutConfig)} - set(field_docs(RolloutConfig))
    assert undocumented == {"max_new_tokens", "top_p"}
    assert set(field_docs(SCHEMAS["rl"])) == {"objective"}


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("One. Two.", "One."),
        ("``auto``: bf16-mixed on CUDA,\n    32-true on CPU.", "auto: bf16-mixed on CUDA, 32-true on CPU."),
        ("Options (e.g. ``correct: 1``) here. More.", "Options (e.g. correct: 1) here."),
        ("See :mod:`klear.rollout.vllm_engine`.\n\nA second paragraph", "See klear.rollout.vllm_engine."),
        ("KV cache size in bytes. 0: off.", "KV cache size in bytes."),
    ],
)
def test_first_sentence(text, first):
    assert first_sentence(text) == first


def test_objective_rows_are_the_chosen_classs_constructor_arguments():
    rows = {row.key: row for row in key_help(load_config("configs/rl.yaml", ["objective.eps_high=0.3"]), "objective")}
    assert list(rows) == [f"objective.{name}" for name in ("name", "eps_low", "eps_high", *GPPO_OWN, "loss_agg")]
    assert (rows["objective.eps_high"].value, rows["objective.eps_high"].default) == ("0.3", "0.28")
    assert rows["objective.dual_clip"].type == "float | None" and rows["objective.dual_clip"].value == "null"
    assert rows["objective.beta_low"].doc.startswith("scale of the gradient (and value) of tokens clipped at the low")
    assert rows["objective.loss_agg"].doc.startswith("one of token-mean,")  # from Objective, where it is introduced
    cispo = {row.key for row in key_help(load_config("configs/rl.yaml", objective="cispo"), "objective")}
    assert "objective.beta_low" not in cispo and "objective.eps_high" in cispo


def test_a_users_objective_by_import_path():
    path = "tests.objectives.test_user_objective:SoftClip"
    rows = key_help(load_config("configs/rl.yaml", ["objective.sharpness=2.0"], objective=path), "objective")
    by_key = {row.key: row for row in rows}
    assert by_key["objective.name"].value == path and by_key["objective.sharpness"].value == "2.0"


def test_args_section_of_a_google_docstring():
    entries = args_section(inspect.cleandoc(GPPO.__doc__))
    assert set(entries) == set(GPPO_OWN)
    assert entries["dual_clip"].endswith("None: off.")


def test_a_section_or_a_key_or_an_error_listing_the_sections():
    config = load_config("configs/rl.yaml")
    assert {row.key for row in key_help(config, "rollout.vllm")} == {
        f"rollout.vllm.{field.name}" for field in dataclasses.fields(VLLMConfig)
    }
    assert [row.key for row in key_help(config, "rollout.top_p")] == ["rollout.top_p"]
    sections = "sections: model, model.lora, data, objective, rollout"
    with pytest.raises(ConfigError, match=rf"'algoritm' is no section .*; {sections}"):
        key_help(config, "algoritm")
    with pytest.raises(ConfigError, match="did you mean 'algorithm'"):
        key_help(config, "algoritm")
    with pytest.raises(ConfigError, match="no section or key of stage 'sft'"):
        key_help(load_config("configs/sft.yaml"), "objective")


ROWS = [KeyHelp("a.b", "int", "1", "2", "word " * 30), KeyHelp("c", "str: x|y", "x", "x", "")]


def test_table_layouts():
    piped = format_table(ROWS).splitlines()
    assert len(piped) == 3 and piped[0].split() == ["KEY", "TYPE", "VALUE", "DEFAULT", "DOC"]
    assert piped[1].index("int") == piped[0].index("TYPE") and piped[1].index("word") == piped[0].index("DOC")
    wide = format_table(ROWS, width=80).splitlines()
    assert all(len(line) <= 80 for line in wide) and len(wide) > 3
    assert all(line.startswith(" " * piped[0].index("DOC")) for line in wide[2:-1])  # doc wrapped under itself
    narrow = format_table(ROWS, width=50).splitlines()
    assert all(len(line) <= 50 for line in narrow) and narrow[1] == "    DOC"
    assert narrow[2].startswith("a.b  int") and narrow[3].startswith("    word")  # each doc under its row


def test_config_help_is_the_table_of_the_rows():
    config = load_config("configs/sft.yaml")
    assert config_help(config, "trainer") == format_table(key_help(config, "trainer"))


def test_the_key_reference_page_is_generated_from_the_schema():
    # docs/configuration.md carries every key of both stages; after a change to the schema's fields or their
    # docs, regenerate it with `python tools/config_reference.py`.
    result = subprocess.run(
        [sys.executable, "tools/config_reference.py", "--check"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    page = Path("docs/configuration.md").read_text()
    for key in ("`rollout.temperature`", "`algorithm.tis_cap`", "`data.max_length`", "`objective.eps_high`"):
        assert f"| {key} |" in page, key
