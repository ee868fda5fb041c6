"""Supervised subprocesses: started with an environment, logged to a file, stopped by PID.

Each process runs in its own session (process group), so stopping it also stops whatever it forked,
and nothing else: the signal goes to that group's PID only.

    cp = SupervisedProcess("cp", ["stoa-cp"], env={...}, log_dir=run_dir, ready=cp_ready)
    cp.start()          # returns once `ready()` holds, or raises with the log's tail
    cp.restart()        # outage tests: stop, then start again with the same command and env
    cp.stop()           # SIGTERM, then SIGKILL after a grace period
    cp.crashed          # it exited although nobody stopped it (what a Supervisor restarts)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Self

from stoa_harness.lifecycle import Lifecycle
from stoa_harness.wait import GiveUp, WaitTimeout, wait_until


class ProcessFailed(GiveUp, RuntimeError):
    """A supervised process exited or never became ready; the message carries its log's tail."""


class SupervisedProcess(Lifecycle):
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        ready: Callable[[], bool] | None = None,
        ready_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env or {})
        self.ready = ready
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.cwd = cwd
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.wanted = False  # started and not stopped on purpose: an exit now is a crash

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def crashed(self) -> bool:
        return self.wanted and not self.running

    def start(self, *, wait_ready: bool = True) -> Self:
        """Start the process; unless `wait_ready` is False, return once `ready()` holds."""
        if self.running:
            raise ProcessFailed(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.argv}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                cwd=self.cwd,
                start_new_session=True,
            )
        self.wanted = True
        if wait_ready and self.ready is not None:
            try:
                wait_until(self._ready_or_dead, self.ready_timeout, f"{self.name} ready")
            except (WaitTimeout, ProcessFailed) as exc:
                self.stop()
                raise ProcessFailed(f"{self.name} did not become ready: {exc}\n{self.log_tail()}") from None
        return self

    def _ready_or_dead(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessFailed(f"{self.name} exited with {self.proc.returncode}")
        assert self.ready is not None
        return self.ready()

    def stop(self) -> int | None:
        """Stop the process group by PID: SIGTERM, then SIGKILL after `stop_timeout`; the exit code."""
        self.wanted = False
        if self.proc is None:
            return None
        return stop_group(self.proc, self.stop_timeout)

    def restart(self) -> Self:
        self.stop()
        return self.start()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The process group stopped by SIGSTOP (up, its sockets open, answering nothing) until the
        block ends, then SIGCONT, whatever happened inside."""
        if self.proc is None or not self.running:
            raise ProcessFailed(f"{self.name} is not running")
        os.killpg(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no log at {self.log_path})"
        return f"--- last {lines} lines of {self.log_path}:\n" + "\n".join(text.splitlines()[-lines:])


def stop_group(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """Stop a process started with `start_new_session=True` and whatever it forked, by its group's
    PID: SIGTERM, then SIGKILL after `timeout`; its exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    return proc.returncode


def tcp_accepting(host: str, port: int) -> bool:
    """True once something accepts TCP connections on host:port (a readiness check for gRPC servers)."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
