"""SFT end to end through the real CLI on the tiny model: loss falls, files and metrics exist, the exported
model loads and generates, and a crash followed by ``--resume`` continues exactly where the run stopped."""

import json
import logging

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from klear.config import ModelConfig
from klear.config.load import load_config
from klear.data.readers import write_jsonl
from klear.data.sft_sets import sft_set
from klear.fit import build_stage, build_trainer, main, prepare_run_dir
from klear.models.loading import load_tokenizer, resolve_model_path
from tests.data.chat_templates import QWEN3_STYLE
from tests.runs import read_metrics

pytestmark = pytest.mark.end_to_end  # runs `klear.fit` main() (whole training runs)

SHORT = [
    "trainer.max_steps=6",
    "trainer.checkpoint_every_n_steps=3",
    "trainer.progress_bar=false",
    "data.num_train=64",
    "data.batch_size=8",
    "data.micro_batch_size=3",
    "data.num_eval=8",
    "eval.num_prompts=8",
    "eval.max_new_tokens=16",
    "eval.every_n_steps=3",
    "optim.lr=3e-3",
    "optim.warmup_steps=1",
]
COMPARED = ["eval/accuracy", "train/grad_norm", "train/loss", "train/lr", "train/tokens"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("sft")
    assert main(["--config", "configs/sft.yaml", f"output_dir={output}", *SHORT]) == 0
    return output


def test_files_metrics_and_falling_loss(finished_run):
    assert (finished_run / "config.yaml").is_file()
    assert [path.name for path in (finished_run / "checkpoints").iterdir()] == ["step-000006.ckpt"]
    rows = read_metrics(finished_run / "metrics.csv")
    assert [int(row["step"]) for row in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert {"train/loss", "eval/accuracy", "train/grad_norm", "train/lr"} <= set(rows[0])
    # eval before the first update, on schedule, and after the last one
    assert [row["step"] for row in rows if row["eval/accuracy"]] == ["0", "3", "6"]
    # each evaluation's answers to the first logging.samples (2) held-out problems, as klear.eval records them
    samples = [json.loads(line) for line in (finished_run / "samples.jsonl").read_text().splitlines()]
    assert [(line["step"], line["split"], line["line"]) for line in samples] == [
        (step, "eval", 0) for step in (0, 3, 6) for _ in range(2)
    ]
    assert all(len(line["samples"]) == line["n"] > 0 and line["reference"] for line in samples)
    losses = [float(row["train/loss"]) for row in rows[:6]]
    assert losses[-1] < losses[0] - 0.3, losses


def test_exported_model_loads_and_generates(finished_run):
    model = AutoModelForCausalLM.from_pretrained(finished_run / "hf")
    tokenizer = AutoTokenizer.from_pretrained(finished_run / "hf")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Start with 3. Add 4."}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5 or out[0, -1].item() == tokenizer.eos_token_id


class SimulatedCrash(Exception):
    pass


class Crash(L.Callback):
    """Kills the run right after the checkpoint of step 3 (and after step 4's row was logged)."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 4:
            raise SimulatedCrash


def test_resume_after_crash_continues_exactly(finished_run, tmp_path, caplog):
    """The resume reads its set from a ``data.cache_dir`` the crashed run did not have (a key that may change on
    ``--resume``), kept there by another process: the continuation equals the run that tokenized its rows itself
    and never stopped."""
    config = load_config("configs/sft.yaml", [f"output_dir={tmp_path}", *SHORT])
    run_dir = prepare_run_dir(config, resume=False, overwrite=False)
    module, batches = build_stage(config, run_dir)
    trainer = build_trainer(config, run_dir, resume=False)
    trainer.callbacks.append(Crash())
    with pytest.raises(SimulatedCrash):
        trainer.fit(module, train_dataloaders=batches)
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.csv")] == ["0", "1", "2", "3", "4"]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(line["step"], line["split"]) for line in samples] == [(0, "eval")] * 2 + [(3, "eval")] * 2

    cache = f"data.cache_dir={tmp_path / 'cache'}"
    kept = OmegaConf.to_object(load_config("configs/sft.yaml", [*SHORT, cache]))
    sft_set(kept, "synthetic", "", load_tokenizer(kept.model))
    caplog.set_level(logging.INFO)
    assert main(["--config", "configs/sft.yaml", f"output_dir={tmp_path}", "--resume", *SHORT, cache]) == 0
    [entry] = (tmp_path / "cache").glob("sft-*.npz")
    assert f"data.train: 8818 tokens, read from {entry} in " in caplog.text
    # step 3's answers were written before the crash, again by the resumed run (from the checkpoint of step 3): once
    assert (tmp_path / "samples.jsonl").read_text() == (finished_run / "samples.jsonl").read_text()
    resumed, uninterrupted = read_metrics(tmp_path / "metrics.csv"), read_metrics(finished_run / "metrics.csv")
    assert [row["step"] for row in resumed] == [row["step"] for row in uninterrupted]
    for a, b in zip(resumed, uninterrupted, strict=True):
        for key in COMPARED:
            assert (a[key] == b[key] == "") or float(a[key]) == pytest.approx(float(b[key]), rel=1e-5), (a, b, key)
    for name, tensor in AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict().items():
        torch.testing.assert_close(tensor, AutoModelForCausalLM.from_pretrained(finished_run / "hf").state_dict()[name])


def test_several_eval_sets_score_each_and_resume_only_on_the_same_rows(tmp_path, capsys):
    """SFT with ``data.eval`` a list (the built-in task and a file of our own rows, named ``held_out``): each set's
    accuracy beside the whole's, ``data_report.json`` by set, and a ``--resume`` over one set's changed rows refused
    naming the set."""
    held_out = tmp_path / "held_out.jsonl"
    write_jsonl([{"problem": f"Start with {n}. Add 1.", "answer": str(n + 1)} for n in range(6)], held_out)
    output = tmp_path / "run"
    args = ["--config", "configs/sft.yaml", f"output_dir={output}", *SHORT, "trainer.max_steps=2"]
    sets = f"data.eval=[synthetic,{held_out}]"
    assert main([*args, sets, "eval.num_prompts=4"]) == 0
    scored = [row for row in read_metrics(output / "metrics.csv") if row["eval/accuracy"]]
    assert [row["step"] for row in scored] == ["0", "2"]
    for row in scored:  # 4 problems of each set, greedy
        together = (float(row["eval/accuracy/synthetic"]) + float(row["eval/accuracy/held_out"])) / 2
        assert float(row["eval/accuracy"]) == pytest.approx(together)
    report = json.loads((output / "data_report.json").read_text())
    assert list(report) == ["train", "eval/synthetic", "eval/held_out"] and report["eval/held_out"]["problems"] == 6
    capsys.readouterr()

    rows = held_out.read_text()
    write_jsonl([{"problem": "Start with 9. Add 1.", "answer": "10"}], held_out)
    assert main([*args, "trainer.max_steps=3", sets, "eval.num_prompts=4", "--resume"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: --resume: the eval/held_out data ({held_out}) differs from the data the run")

    # the same rows again, and a third set named in a mapping: the run goes on and scores it too
    held_out.write_text(rows)
    more = write_jsonl([{"problem": "Start with 3. Add 2.", "answer": "5"}], tmp_path / "more.jsonl")
    mapping = f"data.eval={{synthetic: synthetic, held_out: {held_out}, more: {more}}}"
    assert main([*args, "trainer.max_steps=3", mapping, "eval.num_prompts=4", "--resume"]) == 0
    last = read_metrics(output / "metrics.csv")[-1]
    assert last["step"] == "3" and 0 <= float(last["eval/accuracy/more"]) <= 1 and last["eval/accuracy/held_out"]


def test_several_train_sets_train_as_their_rows_in_one_file_and_resume_only_on_the_same_sets(tmp_path, capsys):
    """SFT with ``data.train`` a list of two files of our own rows, in ShareGPT's and in TRL's ``messages`` layouts:
    each read in its own layout and reported by set, and the run's numbers those of one file holding both sets' rows
    in order (read in one layout); a ``--resume`` with the sets in another order is refused, the same sets in a
    mapping go on."""

    def chat(n, sharegpt):
        question, answer = f"Start with {n}. Add 1.", f"<think>{n} + 1 = {n + 1}</think> \\boxed{{{n + 1}}}"
        if sharegpt:
            return {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]}
        return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}

    shared, messages = tmp_path / "shared.jsonl", tmp_path / "msgs.jsonl"
    write_jsonl([chat(n, True) for n in range(12)], shared)
    write_jsonl([chat(n, False) for n in range(12, 30)], messages)
    both = write_jsonl([chat(n, False) for n in range(30)], tmp_path / "both.jsonl")
    args = ["--config", "configs/sft.yaml", *SHORT, "trainer.max_steps=2", "eval.every_n_steps=0"]
    listed = f"data.train=[{shared},{messages}]"
    assert main([*args, listed, f"output_dir={tmp_path / 'listed'}"]) == 0
    assert main([*args, f"data.train={both}", f"output_dir={tmp_path / 'one'}"]) == 0
    report = json.loads((tmp_path / "listed" / "data_report.json").read_text())
    assert list(report) == ["train/shared", "train/msgs", "eval"]
    assert [report[key]["layout"]["name"] for key in ("train/shared", "train/msgs")] == ["sharegpt", "messages"]
    assert (report["train/shared"]["examples"], report["train/msgs"]["examples"]) == (12, 18)
    whole = json.loads((tmp_path / "one" / "data_report.json").read_text())["train"]
    assert report["train/shared"]["tokens"] + report["train/msgs"]["tokens"] == whole["tokens"] > 30 * 20
    runs = [read_metrics(tmp_path / name / "metrics.csv") for name in ("listed", "one")]
    assert [row["train/loss"] for row in runs[0]] == [row["train/loss"] for row in runs[1]]
    assert runs[0][0]["train/loss"] != ""
    capsys.readouterr()

    resume = [*args, "trainer.max_steps=3", f"output_dir={tmp_path / 'listed'}", "--resume"]
    assert main([*resume, f"data.train=[{messages},{shared}]"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --resume: data.train is the sets msgs, shared; the run started on the sets shared, msgs, and its "
        "data position counts through those sets' problems in that order: resume with the same data.train, or "
        "start a new run in another output_dir"
    )
    assert main([*resume, f"data.train={{shared: {shared}, msgs: {messages}}}"]) == 0
    assert read_metrics(tmp_path / "listed" / "metrics.csv")[-1]["step"] == "3"


def test_tensorboard_logger_writes_events(tmp_path):
    """The metrics, and each evaluation's kept answers as text (``samples/eval``) at its step."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = ["--config", "configs/sft.yaml", f"output_dir={tmp_path}", *SHORT, "trainer.max_steps=2"]
    assert main([*args, "logging.tensorboard=true", "eval.every_n_steps=0"]) == 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    assert "eval/accuracy" in events.Tags()["scalars"]
    texts = events.Tensors("samples/eval/text_summary")
    assert [event.step for event in texts] == [0, 2]
    first = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])
    shown = texts[0].tensor_proto.string_val[0].decode()
    assert shown.startswith(f"**{first['problem']}**\n\nreference: `{first['reference']}`\n\n")


def test_starting_over_a_finished_run_is_refused(finished_run, capsys):
    assert main(["--config", "configs/sft.yaml", f"output_dir={finished_run}", *SHORT]) == 2
    assert "already holds a run; continue it with --resume" in capsys.readouterr().err


def test_multi_turn_reasoning_under_a_qwen3_style_template_trains_turn_by_turn(tmp_path, caplog):
    # A model folder whose tokenizer has a Qwen3-style template (earlier turns lose their reasoning), and
    # multi-turn rows that keep each turn's reasoning in reasoning_content, as DeepSeek's API and Qwen3 write them.
    folder = tmp_path / "qwen3-style"
    AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny")).save_pretrained(folder)
    tokenizer = load_tokenizer(ModelConfig(path="tiny"))
    tokenizer.chat_template = QWEN3_STYLE
    tokenizer.save_pretrained(folder)
    rows = []
    for i in range(12):
        first, second = (
            {"role": "assistant", "content": f"\\boxed{{{i + n}}}", "reasoning_content": f"{i} + {n} = {i + n}."}
            for n in (1, 2)
        )
        rows.append({"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i} + 1?"},
                                  first, {"role": "user", "content": f"{i} + 2?"}, second]})  # fmt: skip
    write_jsonl(rows, tmp_path / "chat.jsonl")
    args = ["--config", "configs/sft.yaml", f"output_dir={tmp_path / 'run'}", *SHORT, "trainer.max_steps=2"]
    args += [f"model.path={folder}", f"data.train={tmp_path / 'chat.jsonl'}", "data.max_length=256"]
    with caplog.at_level(logging.INFO):
        assert main([*args, "eval.every_n_steps=0", "data.batching=packed"]) == 0
    train = json.loads((tmp_path / "run" / "data_report.json").read_text())["train"]
    assert (train["layout"], train["rows"], train["examples"], train["split_rows"]) == (
        {"name": "messages", "turns": "messages"}, 12, 24, 12,
    )  # fmt: skip
    assert any("12 multi-turn rows train each assistant turn as its own example" in note for note in train["notes"])
    assert "layout messages: system 'system' or 'system_prompt'" in caplog.text
    losses = [float(row["train/loss"]) for row in read_metrics(tmp_path / "run" / "metrics.csv")[:2]]
    assert all(loss > 0 for loss in losses)


def test_a_packed_step_trains_as_the_same_examples_padded(tmp_path):
    # Eight examples make one step either way (packed: three to a row of 512, in micro-batches of 3 rows), so the
    # first step's loss, taken before its update, and its gradient norm are the same numbers.
    steps = {}
    for batching in ("padded", "packed"):
        args = ["--config", "configs/sft.yaml", f"output_dir={tmp_path / batching}", *SHORT, "trainer.max_steps=1"]
        assert main([*args, "data.num_train=8", "data.max_length=512", f"data.batching={batching}"]) == 0
        steps[batching] = read_metrics(tmp_path / batching / "metrics.csv")[0]
    for key in ("train/tokens", "train/loss", "train/grad_norm"):
        assert float(steps["packed"][key]) == pytest.approx(float(steps["padded"][key]), rel=1e-5), key


def test_trainer_epochs_is_the_runs_length_in_passes_over_the_packed_set(tmp_path, caplog):
    """Two passes over the packed rows of 64 examples: every step of the second pass trains a batch of the first
    (in another order), ``config.yaml`` records the steps counted, the warmup is a share of them, and
    ``--resume trainer.epochs=3`` adds a third pass."""
    packed = ["data.batching=packed", "data.max_length=512", "data.batch_size=2", "eval.every_n_steps=0"]
    args = ["--config", "configs/sft.yaml", f"output_dir={tmp_path}", *SHORT, *packed, "trainer.epochs=2"]
    args.append("optim.warmup_ratio=0.25")  # of the 20 steps counted: 5
    caplog.set_level(logging.INFO)
    assert main(args) == 0
    [line] = [record.message for record in caplog.records if record.message.startswith("trainer.epochs")]
    per_pass = int(line.split(" steps, ")[1].split(" a pass")[0])
    assert line == (
        f"trainer.epochs = 2: {2 * per_pass} steps, {per_pass} a pass over data.train (2 packed rows a step); "
        "trainer.max_steps = 6 is not used"
    )
    assert per_pass == 10  # 8818 tokens of 64 examples in 19 rows of at most 512, 2 rows a step
    steps = [row for row in read_metrics(tmp_path / "metrics.csv") if row["train/tokens"]]
    assert [int(row["step"]) for row in steps] == list(range(2 * per_pass))
    tokens = [int(float(row["train/tokens"])) for row in steps]
    assert sorted(tokens[:per_pass]) == sorted(tokens[per_pass:]) and tokens[:per_pass] != tokens[per_pass:]
    assert OmegaConf.load(tmp_path / "config.yaml").trainer.max_steps == 2 * per_pass
    report = (tmp_path / "report.md").read_text()
    assert f"| `trainer.max_steps` | {2 * per_pass} (2 passes over data.train) |" in report
    rates = [float(row["train/lr"]) for row in steps]  # after each step's scheduler step: the peak after 5
    assert rates.index(max(rates)) == 4 and max(rates) == pytest.approx(3e-3)
    assert main([*args, "--resume", "trainer.epochs=3"]) == 0
    steps = [row for row in read_metrics(tmp_path / "metrics.csv") if row["train/tokens"]]
    assert [int(row["step"]) for row in steps] == list(range(3 * per_pass))
    assert sum(int(float(row["train/tokens"])) for row in steps[2 * per_pass :]) == sum(tokens[:per_pass])
