"""Hostile programs: each is contained, the reward comes back in time, and the harm demonstrably did not happen.

Most attacks print a marker when they succeed and the test's expected output *is* that marker, so a sandbox
that let the attack through would score 1.0; each such test also runs a harmless control that does score 1.0,
so the test can fail. Attacks whose containment needs Linux namespaces (network, other processes, the
filesystem outside the work dir) are skipped where `detect_isolation` found none; the warning it logs says so.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from klear.rewards import CodeReward, detect_isolation, get_reward
from klear.rewards.sandbox import WALL_FACTOR

pytestmark = pytest.mark.end_to_end  # runs hostile programs that fork in the sandbox

TIMEOUT = 1.0
STARTUP = 2.0  # Python start-up and namespace set-up on a loaded machine
NAMESPACES = detect_isolation().mode == "namespaces"
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="no namespace isolation on this machine")
needs_containment = pytest.mark.skipif(
    not (NAMESPACES or detect_isolation().drop_uid),
    reason="no PID namespace and no uid of its own: a fork bomb hits us",
)


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return get_reward("code", timeout=TIMEOUT, memory_mb=256, max_output_bytes=1 << 16)


def run(reward: CodeReward, body: str, expected: str = "pwned") -> tuple[float, str]:
    """Score ``body`` against one stdin/stdout test; assert it came back in time (within the wall-clock backstop of
    one test's CPU limit: a busy machine slows a program that computes); (score, test detail)."""
    start = time.monotonic()
    outcome = reward.evaluate(f"```python\n{body}\n```", [{"input": "", "output": expected}])
    seconds = time.monotonic() - start
    assert seconds < WALL_FACTOR * reward.limits.timeout + STARTUP, f"the sandbox took {seconds:.2f}s"
    assert outcome.status == "ok", outcome.detail  # the harness itself survived and reported
    return outcome.score, outcome.detail


def harness_processes() -> list[int]:
    """Processes on this machine still running the sandbox harness (or a fork of it)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and b"sandbox_harness.py" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def wait_until_gone(find: object, seconds: float = 2.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := find()) and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    return left


def test_control_program_passes(reward: CodeReward) -> None:
    assert run(reward, "print('pwned')")[0] == 1.0


@needs_containment
def test_fork_bomb(reward: CodeReward) -> None:
    body = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    assert run(reward, body) == (0.0, "0/1 passed (timeout: 1)")
    # every fork is killed with the sandbox; on a loaded machine the kernel takes seconds to reap thousands of them
    assert wait_until_gone(harness_processes, seconds=15.0) == []


def test_memory_bomb(reward: CodeReward) -> None:
    assert run(reward, "x = bytearray(2 * 1024**3)\nprint('pwned')")[0] == 0.0
    assert run(reward, "x = []\nwhile True:\n    x.append(bytearray(10**7))")[0] == 0.0
    assert run(reward, "x = bytearray(10**7)\nprint('pwned')")[0] == 1.0  # control: 10 MB is fine


def test_infinite_loop(reward: CodeReward) -> None:
    assert run(reward, "while True:\n    pass") == (0.0, "0/1 passed (timeout: 1)")


def test_cpu_spin_inside_one_c_call(reward: CodeReward) -> None:
    """No Python-level timeout can interrupt these; SIGKILL can."""
    assert run(reward, "print(sum(range(10**15)))") == (0.0, "0/1 passed (timeout: 1)")
    assert run(reward, "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')") == (0.0, "0/1 passed (timeout: 1)")


def test_flood_of_stdout(reward: CodeReward) -> None:
    flooded = (0.0, "0/1 passed (output_limit: 1)")
    assert run(reward, "import os\nos.write(1, b'x' * 100_000_000)") == flooded  # 100 MB in one write
    assert run(reward, "for _ in range(100):\n    print('x' * 1_000_000)") == flooded  # 100 MB in lines
    assert run(reward, "while True:\n    print('x' * 1000)") == flooded


def test_sleeping_past_the_wall_clock_backstop() -> None:
    """A program that waits uses no CPU time: the wall-clock backstop (`WALL_FACTOR` CPU limits) stops it."""
    reward = get_reward("code", timeout=0.2)
    assert run(reward, "import time\ntime.sleep(60)\nprint('pwned')") == (0.0, "0/1 passed (timeout: 1)")


def test_secret_environment_does_not_leak(reward: CodeReward, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"klear-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("KLEAR_TEST_SECRET_TOKEN", secret)
    hunt = (
        "import os\n"
        "found = [v for v in os.environ.values() if v.startswith('klear-secret-')]\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        data = open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace')\n"
        "    except OSError:\n"
        "        continue\n"
        "    found += [kv.split('=', 1)[1] for kv in data.split('\\0') if kv.startswith('KLEAR_TEST_SECRET_TOKEN=')]\n"
        "print(found[0] if found else 'nothing')"
    )
    assert run(reward, hunt, expected=secret)[0] == 0.0
    assert run(reward, f"print('{secret}')", expected=secret)[0] == 1.0  # control


@needs_namespaces
def test_files_outside_the_work_dir_are_untouched(reward: CodeReward, tmp_path: Path) -> None:
    victims = [tmp_path, Path.home() / f".klear-victim-{uuid.uuid4().hex}"]
    victims[1].mkdir()
    try:
        for folder in victims:
            (folder / "keep.txt").write_text("precious")
            attack = (
                "import os\n"
                f"folder = {str(folder)!r}\n"
                "for action in (lambda: open(os.path.join(folder, 'created.txt'), 'w').write('x'),\n"
                "               lambda: open(os.path.join(folder, 'keep.txt'), 'w').write('overwritten'),\n"
                "               lambda: os.remove(os.path.join(folder, 'keep.txt'))):\n"
                "    try:\n"
                "        action()\n"
                "    except OSError:\n"
                "        pass\n"
                "print('ran')"
            )
            assert run(reward, attack, expected="ran")[0] == 1.0  # the program ran to the end
            assert (folder / "keep.txt").read_text() == "precious"
            assert not (folder / "created.txt").exists()
    finally:
        for path in victims[1].iterdir():
            path.unlink()
        victims[1].rmdir()


@needs_namespaces
def test_no_network(reward: CodeReward) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    attack = (
        "import socket\n"
        f"for address in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
        "    try:\n"
        "        socket.create_connection(address, timeout=0.5).sendall(b'pwned')\n"
        "        print('pwned')\n"
        "        break\n"
        "    except OSError:\n"
        "        pass"
    )
    try:
        assert run(reward, attack)[0] == 0.0
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected to us
    finally:
        listener.close()


@needs_namespaces
def test_killing_its_parent_and_everyone_else(reward: CodeReward) -> None:
    attack = (
        "import os, signal\n"
        "for pid in (os.getppid(), 1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('pwned', flush=True)\n"
        "os.kill(-1, signal.SIGKILL)"  # everything it may signal, itself included
    )
    score, detail = run(reward, attack)  # asserts the harness survived (status "ok")
    assert (score, detail.split("; first error: ")[0]) == (0.0, "0/1 passed (error: 1)")  # it killed itself alone
    assert run(reward, "print('pwned')")[0] == 1.0  # and the sandbox still works


@needs_namespaces
def test_grandchildren_do_not_outlive_the_program(reward: CodeReward) -> None:
    marker = f"{time.time_ns() % 10**6}.4159"
    attack = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        f"subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep({marker})'])\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        f"        os.execvp('sleep', ['sleep', '{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "print('spawned')"
    )

    def survivors() -> list[int]:
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
        return found

    assert run(reward, attack, expected="spawned")[0] == 1.0
    assert wait_until_gone(survivors, seconds=0.5) == []
