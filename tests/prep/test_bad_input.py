"""Bad input to ``python -m klear.data``: one ``error:`` line and exit code 2, no traceback, nothing written or
replaced. An output that exists and is no regular file (a FIFO, a device) is refused before anything is read: the
atomic write would rename a file over it (``synthetic --out /dev/full`` replaced the device, as root, and exited
0); bad mix spec values, curate's ``--band ''`` and unreadable ``--reward-option`` values, an unknown ``mix
--reward`` and a ``dedup --num-perm`` too large for numpy each get their line."""

import json
import os
import stat
from pathlib import Path

import pytest

from klear.data.__main__ import main

pytestmark = pytest.mark.end_to_end  # runs `klear.data` main()

ROWS = [
    {
        "messages": [{"role": "user", "content": f"{i} + 1?"}, {"role": "assistant", "content": f"\\boxed{{{i + 1}}}"}],
        "pass_rate": 0.9,
        "answer": str(i + 1),
    }
    for i in range(3)
]


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def one_error(capsys) -> str:
    """The command's single stderr line, without ``error: ``."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0].removeprefix("error: ")


def test_a_fifo_output_is_refused_and_left_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    assert main(["synthetic", "--num", "2", "--out", str(fifo)]) == 2
    assert one_error(capsys) == (
        f"--out {fifo} is a named pipe, not a regular file: writing it would replace it; "
        "give the path of a file to write"
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["f.jsonl"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_a_device_output_and_a_link_to_one_are_refused(tmp_path, capsys, rows):
    device = tmp_path / "null.jsonl"
    os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a copy of /dev/null
    link = tmp_path / "link.jsonl"
    link.symlink_to(device)
    assert main(["synthetic", "--num", "2", "--out", str(device)]) == 2
    assert one_error(capsys).startswith(f"--out {device} is a character device, not a regular file: ")
    assert main(["dedup", "--data", str(rows), "--out", str(link)]) == 2
    assert one_error(capsys).startswith(f"--out {link} is a symbolic link to a character device, not a regular file")
    assert stat.S_ISCHR(os.lstat(device).st_mode) and link.is_symlink()


def test_a_fifo_report_is_refused(tmp_path, capsys, rows):
    out = tmp_path / "d.jsonl"
    os.mkfifo(tmp_path / "d.report.json")
    assert main(["dedup", "--data", str(rows), "--out", str(out)]) == 2
    assert one_error(capsys).startswith(f"the report of --out {tmp_path / 'd.report.json'} is a named pipe")
    assert not out.exists()


def test_a_link_to_a_regular_file_is_replaced_by_the_output_and_its_target_kept(tmp_path, capsys):
    target = tmp_path / "target.jsonl"
    target.write_text("kept\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert main(["synthetic", "--num", "2", "--out", str(link)]) == 0
    assert not link.is_symlink() and len(link.read_text().splitlines()) == 2 and target.read_text() == "kept\n"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--band", ""], "--band '': give the pass rates to keep, e.g. --band '[0.5, 1]', or a --preset (code, math)"),
        (
            ["--band", "[0, 1]", "--reward-option", "correct=[1"],
            "--reward-option 'correct=[1': the value is not valid YAML (expected ',' or ']', but got '<stream end>'); "
            "write it as YAML, e.g. fallbacks=[answer_is]",
        ),
        (
            ["--band", "[0, 1]", "--reward", "math", "--reward-option", "timeout={a: 1}"],
            "--reward math: '<=' not supported between instances of 'dict' and 'int' (--reward-option "
            "timeout={'a': 1}): give each option a value of the type the reward takes",
        ),
    ],
)
def test_curate_options(tmp_path, capsys, rows, options, message):
    command = ["curate", "--data", str(rows), "--model", "tiny", "--out", str(tmp_path / "c"), *options]
    assert main(command) == 2
    assert one_error(capsys) == message
    assert not (tmp_path / "c").exists()


SOURCE = "{name: a, path: a.jsonl}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sources: [{name: a, path: 5}]", "source 'a': path=5; expected a file path or dataset name (quote one that "
         "YAML reads as a number)"),
        ("sources: [{name: a, path: [1]}]", "source 'a': path=[1]; expected a file path or dataset name"),
        ("sources: [{name: a, path: null}]", "source 'a': path=None; expected a file path or dataset name"),
        ("sources: [{name: [1], path: a.jsonl}]", "SPEC: sources[0] has name=[1]; expected a non-empty text (quoted)"),
        (f"seed: [1]\nsources: [{SOURCE}]", "seed=[1]; expected a whole number"),
        (f"seed: x\nsources: [{SOURCE}]", "seed='x'; expected a whole number"),
        (f"seed: 1.5\nsources: [{SOURCE}]", "seed=1.5; expected a whole number"),
        ("sources: [{name: a, path: a.jsonl, fraction: .inf}]",
         "source 'a': fraction=inf; expected a finite number >= 0"),
        ("sources: [{name: a, path: a.jsonl, fraction: 1.0e+300}]",
         "source 'a': fraction=1e+300 of its 3 rows is 3e+300 rows; a source gives the mix at most 100000000"),
        ("sources: [{name: a, path: a.jsonl, count: 99999999999999999999}]",
         "source 'a': count=99999999999999999999; expected a whole number in [0, 100000000]"),
        ("sources: [{name: a, path: a.jsonl, count: true}]",
         "source 'a': count=True; expected a whole number in [0, 100000000]"),
        ("sources: [{name: a, path: a.jsonl, quality: .nan}]", "source 'a': quality=nan; expected a finite number"),
        ("sources: [{name: a, path: a.jsonl, filter: maybe}]", "source 'a': filter='maybe'; expected true or false"),
        ("sources: [{name: a, path: a.jsonl, filter: 5}]", "source 'a': filter=5; expected true or false"),
        ("sources: [{name: a, path: a.jsonl, 1: 2, x: 3}]", "SPEC: source 'a': unknown key(s) ['x', 1]; accepted: "
         "['name', 'path', 'quality', 'count', 'fraction', 'filter']"),
        ("sources: " + "[" * 5000 + "]" * 5000,
         "SPEC: the mix spec is nested too deeply to read; a spec is a mapping of sources"),
    ],
)  # fmt: skip
def test_bad_mix_spec_values(tmp_path, capsys, rows, spec, message):
    path = tmp_path / "spec.yaml"
    path.write_text(spec)
    out = tmp_path / "m.jsonl"
    assert main(["mix", "--spec", str(path), "--out", str(out)]) == 2
    assert one_error(capsys).startswith(message.replace("SPEC", str(path)))
    assert not out.exists()


def test_a_mix_spec_of_random_bytes_or_a_fifo(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"sources: \xff\xfe\x00\x81")
    assert main(["mix", "--spec", str(spec), "--out", str(tmp_path / "m.jsonl")]) == 2
    assert one_error(capsys) == f"{spec}: the mix spec is not UTF-8 text (byte 9); give a YAML or JSON file"
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    assert main(["mix", "--spec", str(fifo), "--out", str(tmp_path / "m.jsonl")]) == 2
    assert one_error(capsys) == f"{fifo}: the mix spec is a named pipe, not a file; give a .yaml, .yml or .json file"


def test_mix_source_options(tmp_path, capsys, rows):
    out = str(tmp_path / "m.jsonl")
    assert main(["mix", "--source", f"name=a,path={rows},count=[1", "--out", out]) == 2
    assert one_error(capsys) == f"--source 'name=a,path={rows},count=[1': count='[1' is not a YAML value"
    assert main(["mix", "--source", f"name=a,path={rows},filter=maybe", "--out", out]) == 2
    assert one_error(capsys) == "source 'a': filter='maybe'; expected true or false"
    assert main(["mix", "--source", f"name=[1],path={rows},count=2", "--out", out]) == 0  # a name is text
    assert {json.loads(line)["mix_source"] for line in Path(out).read_text().splitlines()} == {"[1]"}


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("bogus", "--reward 'bogus': unknown reward 'bogus'; registered: "),
        (
            "os:system",
            "--reward 'os:system': a reward function is called as fn(response, reference_answer), and this one "
            "cannot be (too many positional arguments)",
        ),
        ("os:no_such_name", "--reward 'os:no_such_name': module 'os' has no attribute 'no_such_name'"),
    ],
)
def test_mix_reward(tmp_path, capsys, rows, reward, message):
    out = tmp_path / "m.jsonl"
    command = ["mix", "--source", f"name=a,path={rows}", "--easy-pass-rate", "0.5", "--reward", reward]
    assert main([*command, "--out", str(out)]) == 2
    assert one_error(capsys).startswith(message)
    assert not out.exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("99999999999999999999", "must be a whole number in [2, 4096], got 99999999999999999999"),
        ("4097", "must be a whole number in [2, 4096], got 4097"),
        ("1", "must be a whole number in [2, 4096], got 1"),
    ],
)
def test_dedup_num_perm_is_bounded(tmp_path, capsys, rows, value, message):
    out = tmp_path / "d.jsonl"
    assert main(["dedup", "--data", str(rows), "--out", str(out), "--near", "minhash", "--num-perm", value]) == 2
    assert one_error(capsys) == f"argument --num-perm: {message} (see python -m klear.data dedup --help)"
    assert not out.exists()


def test_synthetic_num_is_bounded(tmp_path, capsys):
    assert main(["synthetic", "--out", str(tmp_path / "s.jsonl"), "--num", "99999999999999999999"]) == 2
    assert one_error(capsys) == (
        "argument --num: must be a whole number in [1, 10000000], got 99999999999999999999 "
        "(see python -m klear.data synthetic --help)"
    )
    assert not (tmp_path / "s.jsonl").exists()
