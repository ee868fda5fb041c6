"""The supervisor behind `make run`: a crashed process comes back, ever later while it keeps crashing;
a process stopped on purpose stays stopped."""

from __future__ import annotations

import sys
from pathlib import Path

from stoa_harness.processes import SupervisedProcess
from stoa_harness.supervisor import Supervisor
from stoa_harness.wait import wait_until


def test_a_process_that_keeps_crashing_is_restarted_with_a_doubling_delay(tmp_path: Path) -> None:
    crashing = SupervisedProcess("crashing", [sys.executable, "-c", "raise SystemExit(3)"], log_dir=tmp_path)
    lines: list[str] = []
    supervisor = Supervisor([crashing], log=lines.append, first_delay_s=0.05, max_delay_s=0.2)
    crashing.start()

    def restarted_four_times() -> bool:
        supervisor.tick()
        return supervisor.status()["crashing"]["restarts"] >= 4

    try:
        wait_until(restarted_four_times, 10, "4 restarts")
    finally:
        crashing.stop()
    delays = [line.rsplit("restarting in ", 1)[1] for line in lines if "restarting in" in line]
    assert delays[:4] == ["0.05 s", "0.1 s", "0.2 s", "0.2 s"]  # doubling up to the bound
    assert "exit code 3" in lines[0]
    assert "crashing restarted (pid " in lines[1]


def test_a_process_stopped_on_purpose_is_not_restarted(tmp_path: Path) -> None:
    sleeper = SupervisedProcess(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], log_dir=tmp_path
    )
    lines: list[str] = []
    supervisor = Supervisor([sleeper], log=lines.append, first_delay_s=0.01)
    sleeper.start()
    sleeper.stop()
    assert not supervisor.tick()
    assert not sleeper.crashed
    assert supervisor.status()["sleeper"] == {"pid": sleeper.pid, "running": False, "restarts": 0}
    assert lines == []
