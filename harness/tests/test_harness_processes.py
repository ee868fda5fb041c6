"""Waiting on processes: a process that dies while starting is reported at once, with its log."""

import sys
import time
from pathlib import Path

import pytest
from stoa_harness.processes import ProcessFailed, SupervisedProcess
from stoa_harness.wait import GiveUp, WaitTimeout, wait_until


def test_wait_until_returns_the_truthy_value_and_times_out_otherwise() -> None:
    values = iter([None, 0, "ready"])
    assert wait_until(lambda: next(values), timeout=5, interval=0.001) == "ready"
    with pytest.raises(WaitTimeout, match="never"):
        wait_until(lambda: False, timeout=0.05, what="never")


def test_give_up_ends_the_wait_at_once() -> None:
    def gone() -> bool:
        raise GiveUp("the process exited")

    started = time.monotonic()
    with pytest.raises(GiveUp):
        wait_until(gone, timeout=30)
    assert time.monotonic() - started < 5


def test_a_process_that_dies_at_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    proc = SupervisedProcess(
        "doomed",
        [sys.executable, "-c", "import sys; print('cannot start: bad setting'); sys.exit(3)"],
        log_dir=tmp_path,
        ready=lambda: False,
        ready_timeout=60,
    )
    started = time.monotonic()
    with pytest.raises(ProcessFailed, match="cannot start: bad setting"):
        proc.start()
    assert time.monotonic() - started < 20
    assert not proc.running
