"""samples.jsonl: lines that start with their step and split, kept whole across a resume; a step's groups as records."""

import json

import pytest
import torch

from klear.kernels.rollout_batch import ScoredGroups
from klear.models.tokenizer import build_tokenizer
from klear.rollout.engine import Rollout
from klear.run.samples_log import (
    SHOWN_CHARS,
    TABLE_COLUMNS,
    SamplesLog,
    answers_section,
    to_trackers,
    train_records,
)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_new_run_starts_the_file_and_each_line_starts_with_its_step_and_split(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 0, "split": "eval", "left": "by an earlier run"}\n')
    log = SamplesLog(path, 0)
    assert not path.exists()
    log.write(0, "eval", [])  # nothing to keep: no file
    assert not path.exists()
    log.write(0, "eval", [{"problem": "1+1", "samples": [{"text": "é \\boxed{2}"}]}])
    log.write(0, "train", [{"prompt": "p", "samples": []}, {"prompt": "q", "samples": []}])
    assert (
        path.read_text().splitlines()[0]
        == '{"step": 0, "split": "eval", "problem": "1+1", "samples": [{"text": "é \\\\boxed{2}"}]}'
    )
    assert [(line["step"], line["split"], line.get("prompt")) for line in lines(path)] == [
        (0, "eval", None),
        (0, "train", "p"),
        (0, "train", "q"),
    ]


def test_a_resumed_run_keeps_the_lines_of_the_steps_before_its_first(tmp_path):
    """The lines of steps 0 and 2 stay; step 4's (written before the run stopped, and to be written again) and a
    line cut short by a crash go."""
    path = tmp_path / "samples.jsonl"
    kept = '{"step": 0, "split": "eval", "n": 1}\n{"step": 2, "split": "eval", "n": 2}\n{"step": 2, "split": "train"}\n'
    path.write_text(kept + '{"step": 4, "split": "eval", "n": 3}\n{"step": 4, "split": "tr')
    log = SamplesLog(path, 3)
    assert path.read_text() == kept
    log.write(3, "eval", [{"n": 4}])
    assert [(line["step"], line.get("n")) for line in lines(path)] == [(0, 1), (2, 2), (2, None), (3, 4)]
    SamplesLog(path, 0)  # a run that starts over (--overwrite removes the folder first; a new run writes anew)
    assert not path.exists()


def test_a_write_that_fails_names_the_file(tmp_path):
    path = tmp_path / "samples.jsonl"
    log = SamplesLog(path, 0)
    path.mkdir()  # where the file should be
    with pytest.raises(OSError) as error:
        log.write(0, "eval", [{"n": 1}])
    assert error.value.filename == str(path)


def test_train_records_are_the_first_groups_with_each_response_s_reward_and_advantage():
    tokenizer = build_tokenizer()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Add 1 to 1."}], add_generation_prompt=True)
    if isinstance(prompt, dict):  # transformers returns the encoding where a fast tokenizer gives one
        prompt = prompt["input_ids"]
    groups = [
        [Rollout(0, prompt, [5, 6], "\\boxed{2}"), Rollout(0, prompt, [5, 6, 7], "\\boxed{3}", finish_reason="length")],
        [Rollout(1, prompt, [5], "x"), Rollout(1, prompt, [5], "y")],
    ]
    scored = ScoredGroups(
        groups,
        raw=torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        shaped=torch.tensor([[1.0, -0.5], [0.0, 1.0]]),
        correct=torch.tensor([[True, False], [False, True]]),
    )
    advantages = torch.tensor([[0.75, -0.75], [-1.0, 1.0]])
    (record,) = train_records(scored, advantages, tokenizer, groups=1)
    assert record == {
        "prompt": "<|im_start|>user\nAdd 1 to 1.<|im_end|>\n<|im_start|>assistant\n",
        "samples": [
            {
                "text": "\\boxed{2}",
                "reward": 1.0,
                "score": 1.0,
                "correct": True,
                "advantage": 0.75,
                "length": 2,
                "finish_reason": "stop",
            },
            {
                "text": "\\boxed{3}",
                "reward": -0.5,
                "score": 0.0,
                "correct": False,
                "advantage": -0.75,
                "length": 3,
                "finish_reason": "length",
            },
        ],
    }
    per_token = advantages.unsqueeze(-1).expand(2, 2, 4)  # a per-token estimator's: the response's mean
    assert [sample["advantage"] for sample in train_records(scored, per_token, tokenizer, 2)[1]["samples"]] == [-1, 1]
    assert train_records(scored, advantages, tokenizer, groups=5)[1]["samples"][1]["text"] == "y"


def test_the_report_quotes_the_first_problem_s_first_answer_at_the_first_and_last_evaluation(tmp_path):
    path = tmp_path / "samples.jsonl"
    log = SamplesLog(path, 0)
    problem = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is\n1+1?"}]

    def record(texts, correct):
        samples = [{"text": text, "correct": flag} for text, flag in zip(texts, correct, strict=True)]
        return {"set": "aime", "problem": problem, "reference": ["2", "two"], "samples": samples}

    log.write(0, "eval", [record(["no idea"], [False]), record(["x"], [False])])
    log.write(0, "train", [{"prompt": "p", "samples": [{"text": "t"}]}])
    long = "y" * 2_000 + "\n```python\nprint(2)\n```\n \\boxed{2}"
    log.write(5, "eval", [record([long, "\\boxed{3}"], [True, False])])
    with path.open("a") as file:
        file.write('{"step": 6, "split": "ev')  # cut short by a crash: not read
    lines = answers_section(path)
    assert lines[:8] == [
        "## Answers",
        "",
        "The first held-out problem of [samples.jsonl](samples.jsonl) (every answer kept at each evaluation: "
        "`logging.samples`), of the set `aime`, and its first answer at the first and at the last evaluation:",
        "",
        "> What is 1+1?",
        "",
        'Reference: `["2", "two"]`.',
        "",
    ]
    assert lines[8:13] == ["Step 0, wrong (0 of 1 samples correct):", "", "```text", "no idea", "```"]
    assert lines[14:16] == ["Step 5, correct (1 of 2 samples correct):", ""]
    fence, quoted, closing = lines[16:19]
    assert fence == "````text" and closing == "````"  # past the answer's own fence of three
    assert quoted.startswith(f"... ({len(long) - SHOWN_CHARS:,} characters before)\n")
    assert quoted.endswith(" \\boxed{2}")
    assert len(quoted.split("\n", 1)[1]) == SHOWN_CHARS
    assert answers_section(tmp_path / "none.jsonl") == []


EVAL = {"problem": "Add 1 to 1.", "reference": "2", "samples": [{"text": "\\boxed{2}", "correct": True, "length": 4}]}
TRAIN = {
    "prompt": "<|im_start|>user\nAdd 1 to 1.",
    "samples": [{"text": "2", "correct": False, "length": 1, "reward": 0.0, "advantage": -0.5}],
}


def test_the_answers_reach_tensorboard_as_text_at_their_step(tmp_path):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = TensorBoardLogger(tmp_path, name="tb", version="")
    to_trackers([CSVLogger(tmp_path / "csv"), board], 3, "eval", [EVAL])
    to_trackers([board], 3, "train", [TRAIN])
    to_trackers([board], 4, "train", [])  # nothing kept: nothing logged
    board.experiment.flush()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    shown = {
        tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
        for tag in events.Tags()["tensors"]
    }
    assert shown == {
        "samples/eval/text_summary": [
            (3, "**Add 1 to 1.**\n\nreference: `2`\n\ncorrect, 4 tokens:\n\n```text\n\\boxed{2}\n```\n")
        ],
        "samples/train/text_summary": [
            (3, "**<|im_start|>user Add 1 to 1.**\n\nwrong, reward 0, advantage -0.500, 1 tokens:\n\n```text\n2\n```\n")
        ],
    }
    assert not list((tmp_path / "csv").rglob("*.csv"))  # the CSV logger takes metrics only


@pytest.mark.end_to_end  # wandb starts a service process of its own
def test_the_answers_reach_weights_and_biases_as_a_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="klear-test", save_dir=str(tmp_path), offline=True)
    to_trackers([logger], 3, "eval", [EVAL])
    to_trackers([logger], 3, "train", [TRAIN])
    logger.experiment.finish()
    tables = {path.name.split("_")[0]: json.loads(path.read_text()) for path in tmp_path.rglob("*.table.json")}
    assert tables["eval"]["columns"] == tables["train"]["columns"] == TABLE_COLUMNS
    assert tables["eval"]["data"] == [[3, "", "Add 1 to 1.", "2", "\\boxed{2}", True, None, None, 4]]
    assert tables["train"]["data"] == [[3, "", "<|im_start|>user Add 1 to 1.", "", "2", False, 0.0, -0.5, 1]]


def test_a_run_evaluated_once_has_its_one_answer_quoted(tmp_path):
    path = tmp_path / "samples.jsonl"
    SamplesLog(path, 0).write(0, "eval", [{"problem": "p", "reference": "1", "samples": [{"text": "a"}]}] * 2)
    lines = answers_section(path)
    assert [line for line in lines if line.startswith("Step ")] == ["Step 0, wrong (0 of 1 samples correct):"]
