"""The failure board of `klear.run.rank_failure`, on a real c10d store in this process: which failure ends a run,
when a rank stops reading, what is written and what is not. The runs with two ranks are `test_rank_failure_runs`."""

import datetime
import signal
import threading

import lightning as L
import pytest
import torch.distributed as dist

from klear.rollout.refresh import LogprobGapError
from klear.run.rank_failure import COUNT_KEY, Failure, RankFailures, boards, exit_message
from klear.run.stopping import StopRequested


def board(rank: int, store=None) -> RankFailures:
    failures = RankFailures(lambda failure: None, threading.Lock(), agreed=(StopRequested, LogprobGapError))
    failures.rank, failures.store = rank, dist.HashStore() if store is None else store
    return failures


def trainer() -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)


def test_the_first_failure_written_ends_the_run_and_a_rank_that_died_comes_before_any():
    zero = board(0)
    assert zero.first() is None
    zero.write(Failure(2, "RuntimeError", "boom", step=3))
    zero.write(Failure(0, "RuntimeError", "Connection closed by peer"))
    assert zero.first() == Failure(2, "RuntimeError", "boom", step=3)
    zero.write(Failure(1, "exited", exit_message(-signal.SIGKILL)))  # written late, by the launcher's watcher
    assert zero.first() == Failure(1, "exited", "was killed by SIGKILL (the out-of-memory killer, or kill -9)")


def test_the_lines_name_the_rank_and_what_ended_it():
    boom = Failure(1, "RuntimeError", "boom", step=4)
    assert boom.describe() == "RuntimeError on rank 1: boom"
    assert boom.line() == (
        "rank 1 failed at step 4: RuntimeError: boom; every rank stopped (the traceback is in rank 1's output, "
        "its lines prefixed [rank1])"
    )
    phrase = Failure(2, "", "out of memory in a forward and backward pass (could not allocate 2.0 GiB)", step=5)
    assert phrase.describe() == "out of memory in a forward and backward pass (could not allocate 2.0 GiB) on rank 2"
    assert phrase.line() == (
        "rank 2 failed at step 5: out of memory in a forward and backward pass (could not allocate 2.0 GiB); every "
        "rank stopped (rank 2's own error line says what to change)"
    )
    died = Failure(3, "exited", exit_message(2))
    assert died.describe() == "rank 3 exited with status 2" and died.died
    assert died.line() == "rank 3 exited with status 2, so every rank stopped"
    assert exit_message(-signal.SIGTERM) == "was killed by SIGTERM"
    assert exit_message(-99) == "was killed by signal 99"


def test_a_rank_other_than_0_stops_reading_once_another_failed_and_rank_0_waits_for_a_death():
    store = dist.HashStore()
    one, zero = board(1, store), board(0, store)
    one.write(Failure(2, "RuntimeError", "boom"))
    assert one.first() == Failure(2, "RuntimeError", "boom") and one.settled()
    assert zero.first() == Failure(2, "RuntimeError", "boom") and not zero.settled()
    zero.write(Failure(2, "exited", exit_message(1)))  # would come first, were rank 1 still reading
    assert one.first() == Failure(2, "RuntimeError", "boom")
    assert zero.first() == Failure(2, "exited", "exited with status 1") and zero.settled()


def test_a_rank_waits_for_another_rank_s_failure_only_as_long_as_asked():
    zero = board(0)
    zero.write(Failure(0, "RuntimeError", "Connection closed by peer"))
    later = threading.Timer(0.2, zero.write, args=(Failure(1, "exited", exit_message(-signal.SIGKILL)),))
    later.start()
    assert zero.first() == Failure(0, "RuntimeError", "Connection closed by peer")  # its own, at once
    assert zero.first(wait_s=5.0).rank == 1
    later.join()


def test_stops_and_failures_every_rank_meets_are_not_written_nor_those_another_rank_caused():
    fit = trainer()
    zero = board(0)
    for agreed in (StopRequested("SIGTERM"), LogprobGapError("gap"), KeyboardInterrupt()):
        zero.on_exception(fit, None, agreed)
    assert zero.store.add(COUNT_KEY, 0) == 0
    zero.on_exception(fit, None, ValueError("bad row\nmore"))
    assert zero.first() == Failure(0, "ValueError", "bad row", step=0)
    one = board(1, zero.store)
    one.write(Failure(0, "RuntimeError", "boom"))
    assert one.first().rank == 0
    one.on_exception(fit, None, RuntimeError("Connection closed by peer"))  # caused by rank 0's: not written
    assert zero.store.add(COUNT_KEY, 0) == 2


def test_a_rank_that_exited_is_written_unless_it_wrote_its_own_failure():
    zero = board(0)
    zero.write(Failure(1, "RuntimeError", "boom"))
    zero.rank_exited(1, 1)  # its own failure says more
    zero.rank_exited(2, -signal.SIGKILL)
    assert zero._read() == [Failure(1, "RuntimeError", "boom"), Failure(2, "exited", exit_message(-9))]


def test_a_store_that_stops_answering_is_rank_0_gone():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=5))
    one = board(1, client)
    assert one.first() is None
    del server
    one.rank_exited(2, -signal.SIGKILL)  # a rank it started ended too: nothing to write it to, and no error
    assert one.first() == Failure(0, "exited", "is gone (the process group's store stopped answering)")
    assert one.settled()


def test_a_board_is_where_started_ranks_report_from_its_opening_until_it_closes():
    failures = board(0)
    assert failures not in boards
    failures.open()
    assert failures in boards
    failures.close()
    assert failures not in boards and failures.done.is_set()


@pytest.fixture(autouse=True)
def no_boards_left():
    yield
    for failures in list(boards):
        failures.close()
