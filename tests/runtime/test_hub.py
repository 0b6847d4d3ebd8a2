"""A model given by its hub name on a machine that cannot reach the Hub: loaded from the local cache at once (no
network retries), or one error naming the cache; with a Hub that answers, or ``HF_HUB_OFFLINE`` set, nothing
changes. The Hub here is a local server, or a port nothing listens on."""

import http.server
import logging
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from huggingface_hub import constants

from klear.models import resolve_model_path
from klear.runtime.hub import HubUnreachable, check_hub_access, unreachable
from tests.test_user_errors import klear, one_line_error

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub(http.server.BaseHTTPRequestHandler):
    """A Hub that answers every request with 404, and counts them."""

    requests: ClassVar[list[str]] = []

    def do_HEAD(self) -> None:
        Hub.requests.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def answering_hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hub.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_port() -> str:
    """An address where nothing listens (refused at once, as a cluster node's firewall or missing DNS fails)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def cache_with_tiny(home: Path) -> Path:
    """``home/hub`` holding the built-in tiny model as the hub model ``acme/tiny``, as ``hf download`` leaves it."""
    repo = home / "hub" / "models--acme--tiny"
    shutil.copytree(resolve_model_path("tiny"), repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return home / "hub"


@pytest.fixture
def hub_settings(tmp_path, monkeypatch) -> Path:
    """huggingface_hub's settings for this test (put back after it): a cache holding ``acme/tiny``, online mode."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache_with_tiny(tmp_path)))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "")  # recorded, so that what a test's check sets is undone after it
    monkeypatch.delenv("HF_HUB_OFFLINE")
    return tmp_path


def test_a_hub_that_answers_changes_nothing(hub_settings, answering_hub, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", answering_hub)
    assert unreachable(answering_hub) is None
    check_hub_access.__wrapped__("acme/tiny")
    assert Hub.requests == ["/", "/"]  # one request each, no retry
    assert not constants.HF_HUB_OFFLINE and "HF_HUB_OFFLINE" not in os.environ


def test_offline_mode_asks_nothing(hub_settings, answering_hub, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", answering_hub)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    check_hub_access.__wrapped__("acme/nothere")
    assert Hub.requests == []


def test_an_unreachable_hub_loads_a_cached_model_offline(hub_settings, monkeypatch, caplog):
    endpoint = closed_port()
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    with caplog.at_level(logging.WARNING, logger="klear.runtime.hub"):
        check_hub_access.__wrapped__("acme/tiny")
    assert constants.HF_HUB_OFFLINE and os.environ["HF_HUB_OFFLINE"] == "1"
    [line] = caplog.messages
    assert line.startswith(f"the Hugging Face Hub ({endpoint}) cannot be reached (")
    assert line.endswith("the model acme/tiny is loaded from the local cache; set HF_HUB_OFFLINE=1 to skip this check")


def test_an_unreachable_hub_without_the_model_is_one_error(hub_settings, monkeypatch):
    endpoint = closed_port()
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    with pytest.raises(HubUnreachable) as raised:
        check_hub_access.__wrapped__("acme/nothere")
    message = str(raised.value)
    assert message.startswith(
        f"acme/nothere is not in this machine's Hugging Face cache ({hub_settings / 'hub'}) and the Hub ({endpoint}) "
        "cannot be reached ("
    )
    advice = "download it where there is a network (hf download acme/nothere) into this cache (HF_HOME), or give"
    assert message.endswith(f"{advice} the model's folder")
    assert not constants.HF_HUB_OFFLINE and "\n" not in message


@pytest.mark.end_to_end  # the commands, in subprocesses
def test_commands_on_a_machine_without_the_hub(tmp_path):
    """``klear.eval`` of a cached hub model runs with no network retry; one not cached is one line (exit 2), and so
    are a hub dataset not cached and ``klear.fit``'s model, before ``output_dir`` is made."""
    cache_with_tiny(tmp_path)
    env = {"HF_HOME": str(tmp_path), "HF_ENDPOINT": closed_port(), "HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": ""}
    data = tmp_path / "math.jsonl"
    assert klear("klear.data", "synthetic", "--task", "math", "--num", "4", "--out", str(data)).returncode == 0
    args = ["--data", str(data), "--k", "1", "--max-new-tokens", "32"]
    cached = klear("klear.eval", "--model", "acme/tiny", *args, "--output", str(tmp_path / "eval"), env=env)
    assert cached.returncode == 0, cached.stderr[-3000:]
    assert "the model acme/tiny is loaded from the local cache" in cached.stderr
    assert "Retry" not in cached.stderr and "thrown while requesting" not in cached.stderr
    assert (tmp_path / "eval" / "summary.json").is_file()

    missing = klear("klear.eval", "--model", "acme/nothere", *args, "--output", str(tmp_path / "e2"), env=env)
    assert one_line_error(missing).startswith("error: --model acme/nothere: acme/nothere is not in this machine's")
    assert "Retry" not in missing.stderr
    dataset = [*args[2:], "--output", str(tmp_path / "e3")]  # a hub dataset that datasets' cache lacks
    no_data = klear("klear.eval", "--model", "tiny", "--data", "acme/nodata", *dataset, env=env)
    assert one_line_error(no_data).startswith("error: acme/nodata: datasets could not load it (")
    assert "the dataset acme/nodata is loaded from the local cache" in no_data.stderr
    assert "Retry" not in no_data.stderr
    output = tmp_path / "run"
    fit = klear("klear.fit", "--config", "configs/rl.yaml", "model.path=acme/nothere", f"output_dir={output}", env=env)
    assert one_line_error(fit).startswith("error: model.path = 'acme/nothere' cannot be loaded: acme/nothere is not")
    assert not output.exists()
