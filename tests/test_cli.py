"""The ``klear`` console command: ``klear fit|eval|compare|data ARGS`` is ``python -m klear.<command> ARGS`` (same
arguments, set-up and exit status), ``klear --help`` / ``--version`` import nothing heavy, a missing or unknown
command is usage and exit 2; and ``--help-config`` through both front-ends. Every command runs as a user runs it,
in a subprocess of the installed script."""

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import klear
from tests.runs import read_metrics
from tests.test_commands import SHORT_RL, evals, run_outputs

pytestmark = pytest.mark.end_to_end  # runs the installed `klear` script and `python -m` in subprocesses

ROOT = Path(__file__).parents[1]
SCRIPT = shutil.which("klear", path=str(Path(sys.executable).parent)) or shutil.which("klear")


def klear_command(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    """``klear ARGS``, the installed console script; a traceback anywhere on the terminal fails the test."""
    assert SCRIPT, "no klear script next to the interpreter: pip install -e ."
    result = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-4000:]
    return result


def python_m(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def heavy_modules_after(code: str) -> list[str]:
    """The heavy packages imported by ``code`` (which may exit) in a fresh interpreter."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('heavy', sorted(m for m in ('torch', 'transformers', 'lightning', 'vllm') "
        "if m in sys.modules), file=sys.stderr))\n" + code
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    line = [line for line in result.stderr.splitlines() if line.startswith("heavy ")]
    assert line, result.stderr[-2000:]
    return ast.literal_eval(line[-1].removeprefix("heavy "))


def test_version_is_the_package_version():
    result = klear_command("--version")
    assert result.returncode == 0 and result.stdout == f"klear {klear.__version__}\n"


def test_help_lists_every_command_on_one_line_without_heavy_imports():
    result = klear_command("--help")
    assert result.returncode == 0
    listed = {line.split()[0]: line for line in result.stdout.splitlines() if re.match(r"  \w+ {2,}\S", line)}
    assert list(listed) == ["fit", "eval", "compare", "data"], result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    for flag in ("--help", "--version"):
        assert heavy_modules_after(f"from klear.cli import main\nmain([{flag!r}])") == []


@pytest.mark.parametrize(("args", "message"), [([], "required: COMMAND"), (["fitt"], "unknown command 'fitt'")])
def test_no_or_an_unknown_command_is_one_line_and_exit_2(args, message):
    result = klear_command(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stderr.endswith(" (see klear --help)\n")
    assert ("did you mean 'fit'?" in result.stderr) == bool(args)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (
            ["klear.eval", "--data", "x", "--k", "1e3"],
            "argument --k: invalid int value: '1e3' (see python -m klear.eval",
        ),
        (["klear.fit", "--bogus"], "unrecognized arguments: --bogus (see python -m klear.fit --help)"),
        (["klear.fit", "-q", "-v"], "argument -v/--verbose: not allowed with argument -q/--quiet"),
        (["klear.compare", "--jobs", "x"], "argument --jobs: invalid int value: 'x' (see python -m klear.compare"),
        (["klear.data", "bogus"], "argument COMMAND: invalid choice: 'bogus' (choose from 'synthetic'"),
    ],
)
def test_a_bad_argument_of_any_command_is_one_line_and_exit_2(command, message):
    result = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and message in result.stderr


@pytest.mark.parametrize("command", ["fit", "eval", "compare", "data"])
def test_each_command_takes_the_arguments_of_python_m(command):
    # The same parser answers both: `klear COMMAND --help` prints what `python -m klear.COMMAND --help` prints,
    # under the name it was called by.
    result = klear_command(command, "--help")
    expected = python_m(f"klear.{command}", "--help").stdout
    assert result.returncode == 0 and expected.startswith(f"usage: python -m klear.{command} ")
    assert result.stdout.startswith(f"usage: klear {command} ")
    renamed = expected.replace(f"python -m klear.{command}", f"klear {command}", 1)  # the usage line
    assert result.stdout.split() == renamed.split()  # the same text; argparse rewraps the shorter usage line


def test_fit_rl_with_gppo(tmp_path):
    output = tmp_path / "rl"
    args = ["--objective", "gppo", "--config", "configs/rl.yaml", f"output_dir={output}", *SHORT_RL]
    result = klear_command("fit", *args, "rollout.prompts_per_step=4", "trainer.progress_bar=false")
    assert result.returncode == 0, result.stderr[-4000:]
    run_outputs(output)
    assert len(read_metrics(output / "metrics.csv")) == 3 and len(evals(output)) == 2
    assert evals(output)[0] > 0.2  # tiny-sft solves part of the held-out problems from the start
    assert str(output / "hf") in result.stdout  # the closing summary
    assert re.search(r"^INFO klear\.\S+: ", result.stderr, re.MULTILINE)  # the log set-up of python -m klear.fit


def test_fit_errors_keep_their_exit_code_and_one_line():
    result = klear_command("fit", "--config", "configs/rl.yaml", "rollout.tempreature=0.5")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: unknown config key 'rollout.tempreature'; accepted keys of section 'rollout'")
    assert line.endswith("did you mean 'rollout.temperature'?")


def test_data_synthetic(tmp_path):
    result = klear_command("data", "synthetic", "--split", "eval", "--num", "7", "--out", "eval.jsonl", cwd=tmp_path)
    assert result.returncode == 0 and "wrote 7 math eval problems" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and all(row["problem"] and row["answer"] for row in rows)
    bad = klear_command("data", "synthetic", "--levels", "9", "--out", "x.jsonl", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --levels '9'")


def help_rows(stdout: str) -> dict[str, list[str]]:
    """Key -> [type, value, default, doc] of a piped ``--help-config`` table (one line per key)."""
    header, *lines = stdout.splitlines()
    starts = [header.index(name) for name in ("TYPE", "VALUE", "DEFAULT", "DOC")]
    rows = {}
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip([0, *starts], [*starts, None], strict=True)]
        rows[cells[0]] = cells[1:]
    return rows


def test_help_config_of_one_section_with_overrides():
    args = ["--config", "configs/rl.yaml", "--help-config", "rollout", "rollout.temperature=0.7"]
    result = klear_command("fit", *args)
    assert result.returncode == 0, result.stderr
    rows = help_rows(result.stdout)
    assert all(key.startswith("rollout.") for key in rows) and "rollout.vllm.gpu_memory_utilization" in rows
    kind, value, default, doc = rows["rollout.temperature"]
    assert kind.startswith("float") and value == "0.7" and default == "1.0" and doc.startswith("Sampling temperature")
    assert rows["rollout.max_new_tokens"][1:3] == ["96", "32768"]  # configs/rl.yaml's value, the dataclass default
    assert result.stdout == python_m("klear.fit", *args).stdout


def test_help_config_of_every_key_imports_neither_lightning_nor_transformers():
    code = "from klear.cli import main\nmain(['fit', '--config', 'configs/rl.yaml', '--help-config'])"
    assert set(heavy_modules_after(code)) <= {"torch"}  # torch: the RL check imports the objectives
    rows = help_rows(klear_command("fit", "--config", "configs/rl.yaml", "--help-config").stdout)
    assert {"stage", "model.path", "objective.eps_high", "algorithm.advantage", "logging.wandb"} <= set(rows)
    assert rows["objective.eps_high"][1:3] == ["0.28", "0.28"]  # gppo's constructor default


def test_data_commands_without_a_model_import_no_model_stack(tmp_path):
    """synthetic, dedup, decontaminate, mix and filter-tests start in a fraction of a second: curate loads a model."""
    rows = tmp_path / "train.jsonl"
    code = (
        "from klear.prep.cli import main\n"
        f"assert main(['synthetic', '--num', '20', '--out', {str(rows)!r}]) == 0\n"
        f"assert main(['dedup', '--data', {str(rows)!r}, '--out', {str(tmp_path / 'dedup.jsonl')!r}]) == 0"
    )
    assert heavy_modules_after(code) == []
    assert (tmp_path / "dedup.jsonl").is_file()


def test_help_config_of_an_unknown_section_lists_the_sections():
    result = klear_command("fit", "--config", "configs/rl.yaml", "--help-config", "rolout")
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert "'rolout'" in line and "sections: model, model.lora, data, objective, rollout, rollout.vllm, reward" in line
    assert line.endswith("did you mean 'rollout'?")


def test_a_reader_that_stops_early_gets_no_traceback():
    # `| head -2` closes the pipe after two lines: exit 141 (128 + SIGPIPE, as coreutils' commands), no traceback.
    for command in (
        f"{SCRIPT} fit --list-objectives | head -2",
        f"{sys.executable} -m klear.fit --list-objectives | true",
    ):
        result = subprocess.run(
            ["bash", "-c", f"set +o pipefail; {command}; echo status ${{PIPESTATUS[0]}}"],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
        assert result.stdout.splitlines()[-1] in ("status 141", "status 0"), result.stdout  # 0: all written in time
    assert result.stdout.strip() == "status 141"  # `true` reads nothing: the first write finds the pipe closed


def test_a_path_too_long_for_the_file_system_is_one_line_in_every_command(tmp_path):
    long = tmp_path / ("a" * 300)  # a name longer than any Linux file system takes (255 bytes)
    commands = [
        ["klear.fit", "--config", "configs/rl.yaml", f"output_dir={long}"],
        ["klear.fit", "--config", f"{long}.yaml"],
        ["klear.eval", "--model", str(long), "--data", "x.jsonl"],
        ["klear.data", "show", f"{long}.jsonl"],
        ["klear.compare", "--config", "configs/rl.yaml", "--objectives", "gppo", "--seeds", "0", f"output_dir={long}"],
    ]
    for command in commands:
        result = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (command, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: file name too long: {long}"), (command, lines)


def test_a_command_ends_as_the_interpreter_would_without_its_teardown(tmp_path):
    """`klear.cli.leave`, how every command's process ends: a thread that is not a daemon is waited for, the atexit
    handlers run (a temporary folder's finalizer among them), buffered output is written, and the exit status is
    the one given."""
    code = (
        "import atexit, sys, tempfile, threading, time\n"
        "from klear.cli import leave\n"
        "folder = tempfile.TemporaryDirectory(dir=sys.argv[1])\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\n"
        "atexit.register(lambda: print('atexit'))\n"
        "print('buffered', end=' ')\n"
        "leave(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "buffered thread\natexit\n" and result.stderr == ""
    assert list(tmp_path.iterdir()) == []  # the temporary folder's finalizer ran
