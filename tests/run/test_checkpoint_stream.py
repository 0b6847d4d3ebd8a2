"""`klear.run.checkpoints.stream_to`: what a write of the checkpoint file raised is what the save raises, not
``torch.save``'s ``RuntimeError: unexpected pos``: a full disk's ``OSError``, and a Ctrl-C that lands in the middle
of a write, whose ``KeyboardInterrupt`` must reach the run's Ctrl-C handling (summary, resume command, exit 130)
rather than end it with a traceback."""

import errno
import io

import pytest
import torch

from klear.run.checkpoints import stream_to

CHECKPOINT = {"state_dict": {"a": torch.zeros(4096), "b": torch.ones(4096)}, "step": 3}


class FailingFile(io.BytesIO):
    """A binary file whose write number ``after + 1`` raises ``error``."""

    def __init__(self, after: int, error: BaseException) -> None:
        super().__init__()
        self.after, self.error, self.writes = after, error, 0

    def write(self, data) -> int:
        self.writes += 1
        if self.writes > self.after:
            raise self.error
        return super().write(data)


@pytest.mark.parametrize("after", [0, 2, 5])
def test_a_ctrl_c_during_a_write_stays_a_keyboard_interrupt(after):
    file = FailingFile(after, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        stream_to(CHECKPOINT, file)
    assert file.writes > after  # it did land in a write (torch.save may try one more as it closes the file)


def test_a_full_disk_during_a_write_is_its_os_error():
    with pytest.raises(OSError) as raised:
        stream_to(CHECKPOINT, FailingFile(2, OSError(errno.ENOSPC, "No space left on device")))
    assert raised.value.errno == errno.ENOSPC


def test_a_whole_write_loads_back():
    file = FailingFile(10**6, OSError())
    stream_to(CHECKPOINT, file)
    loaded = torch.load(io.BytesIO(file.getvalue()), weights_only=True)
    assert loaded["step"] == 3 and torch.equal(loaded["state_dict"]["b"], CHECKPOINT["state_dict"]["b"])
