"""Isolation detection: what the sandbox reports on this machine, and the loud, explicit fallback."""

from __future__ import annotations

import logging
import os

import pytest

from klear.rewards import SandboxLimits, detect_isolation, sandbox
from klear.rewards.sandbox import run_sandboxed

pytestmark = pytest.mark.end_to_end  # starts sandbox subprocesses

PRINT_UID = "import os\nprint(os.getuid())"


@pytest.mark.skipif(detect_isolation().mode != "namespaces", reason="no namespace isolation on this machine")
def test_namespace_isolation_report() -> None:
    isolation = detect_isolation()
    run = run_sandboxed(PRINT_UID, [{"kind": "stdio", "input": ""}], ["0"], SandboxLimits(timeout=5), isolation)
    assert run.status == "ok"
    report = run.isolation
    assert report["pid1"] is True
    assert report["readonly_failures"] == 0 and report["readonly_mounts"] > 0
    assert "/tmp" in report["tmpfs"]
    if os.geteuid() == 0:
        assert isolation.drop_uid and report["uid"] >= 100_000
        assert run.tests == ["wrong"]  # not root inside
    else:
        assert report["uid"] is None


def test_missing_unshare_falls_back_loudly(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    detect = sandbox._detect.__wrapped__  # the probe itself, not this process's cached answer
    with pytest.raises(RuntimeError, match="isolation='namespaces' was requested but the `unshare` command"):
        detect("namespaces")
    with caplog.at_level(logging.WARNING, logger="klear.rewards.sandbox"):
        isolation = detect("auto")
    assert isolation.mode == "process"
    assert "unshare" in isolation.missing
    assert "process isolation only, because the `unshare` command (util-linux) was not found" in caplog.text
    assert "CAN open network connections" in caplog.text
    run = run_sandboxed("print(input())", [{"kind": "stdio", "input": "7"}], ["7"], SandboxLimits(timeout=5), isolation)
    assert run.tests == ["passed"]  # still runs programs, with rlimits and a deadline


def test_unknown_isolation_level() -> None:
    with pytest.raises(ValueError, match="unknown isolation 'docker'"):
        detect_isolation("docker")
