"""`stoa-estate run` (what `make run` starts), as a user runs it: a real launcher process in its own
directory. It restarts a process that crashes, and quick stop signals in a row stop it and every
process it started.

The module's tests share one launcher; the stop test comes last, as it ends it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from stoa_harness.cp_client import CPClient
from stoa_harness.idp import s256
from stoa_harness.processes import stop_group
from stoa_harness.site import console_script
from stoa_harness.wait import GiveUp, wait_until

START_TIMEOUT_S = 180.0
RECOVERY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 90.0
POLL_INTERVAL_S = 0.2


@dataclass
class Launcher:
    proc: subprocess.Popen[bytes]
    cwd: Path

    @property
    def state_file(self) -> Path:
        return self.cwd / ".stoa" / "estate.json"

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def pids(self) -> dict[str, int]:
        return {name: p["pid"] for name, p in self.state()["processes"].items() if p.get("pid")}

    def output(self) -> str:
        return (self.cwd / "launcher.log").read_text(errors="replace")

    def check_running(self) -> bool:
        """True while the launcher runs; GiveUp (with its output) once it has exited."""
        if self.proc.poll() is not None:
            raise GiveUp(f"stoa-estate run exited with {self.proc.returncode}:\n{self.output()}")
        return True


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_mentioning(text: str) -> dict[int, str]:
    """Live processes (pid: command line) whose command line holds `text` (the launcher's directory)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and alive(int(entry.name)):
            found[int(entry.name)] = cmdline
    return found


def stop_leftovers(launcher: Launcher) -> None:
    """Stop whatever is left (after a failure only, when the test passed), by PID, and remove the
    launcher's directory."""
    if launcher.proc.poll() is None:
        stop_group(launcher.proc, 30)
    for pid in processes_mentioning(str(launcher.cwd)):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(launcher.cwd, ignore_errors=True)


def launch() -> Launcher:
    """`stoa-estate run` in a directory of its own, in its own session. Its temporary files
    (PostgreSQL's data directory among them) go under that directory too, so every process it
    starts names the directory on its command line. Not under pytest's temporary directory: the
    PostgreSQL user must be able to reach it."""
    cwd = Path(tempfile.mkdtemp(prefix="stoa-launcher-"))
    cwd.chmod(0o711)
    (cwd / "tmp").mkdir(mode=0o711)
    with (cwd / "launcher.log").open("wb") as log:
        proc = subprocess.Popen(
            [console_script("stoa-estate"), "run"],
            cwd=cwd,
            env={**os.environ, "TMPDIR": str(cwd / "tmp")},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Launcher(proc, cwd)


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    running = launch()
    try:
        wait_until(
            lambda: running.check_running() and running.state_file.exists(),
            START_TIMEOUT_S,
            "stoa-estate run to write .stoa/estate.json",
        )
        yield running
    finally:
        stop_leftovers(running)


@pytest.fixture
def starting() -> Iterator[Launcher]:
    running = launch()
    try:
        yield running
    finally:
        stop_leftovers(running)


def test_stop_signals_during_start_up_stop_what_was_started(starting: Launcher) -> None:
    where = str(starting.cwd)
    # Start-up is under way once a process it started runs (PostgreSQL's come first).
    wait_until(
        lambda: starting.check_running() and processes_mentioning(where),
        START_TIMEOUT_S,
        "a process started by the launcher",
        interval=0.005,
    )
    os.killpg(starting.proc.pid, signal.SIGTERM)
    os.killpg(starting.proc.pid, signal.SIGTERM)
    code = starting.proc.wait(timeout=STOP_TIMEOUT_S)
    assert code == 128 + signal.SIGTERM, starting.output()
    assert "stopped by SIGTERM during start-up" in starting.output()
    assert wait_until(lambda: not processes_mentioning(where), 10, "nothing left running")
    assert not starting.state_file.exists()


def test_the_first_screen_shows_the_demo_api_decided_by_envoy(launcher: Launcher) -> None:
    # The first screen is printed once .stoa/estate.json is written, in one write.
    output = wait_until(
        lambda: "Ctrl-C stops everything." in (text := launcher.output()) and text, 30, "the first screen"
    )
    assert "with the demo token  -> 200" in output
    assert "without a token      -> 401" in output
    assert "both decided by Envoy itself" in output
    # An agent's view through the gateway, with the real mcp client: the demo tenant's tools as the
    # demo token may call them (one of two granted), and the granted one called.
    state = launcher.state()
    assert state["mcp_url"] == f"{state['gateway_url']}/mcp/demo"
    assert f"tools/list with the demo token  -> {state['granted_tools']} (of {state['demo_tools']})" in output
    assert len(state["demo_tools"]) == 2
    assert "tools/call echo_read {text: hello}      -> the echo API saw GET /" in output


def decided_by_the_service(launcher: Launcher) -> tuple[str, dict[str, str]]:
    """A URL through Envoy whose requests the authorization service decides (an API with the
    identity envelope: the demo API is decided by Envoy alone), and the headers that pass it."""
    state = launcher.state()
    with CPClient(state["cp_url"], state["admin_token"], gateway_id=state["gateway_id"]) as cp:
        cp.create_api(
            "enveloped",
            tenant_id=state["demo_tenant"],
            upstream_url=state["upstream_url"],
            auth={"mode": "jwt", "scopes": [], "envelope": True},
        )
        cp.wait_synced(cp.deploy("enveloped"), timeout=60)
    return f"{state['gateway_url']}/apis/enveloped/x", {"authorization": f"Bearer {state['demo_token']}"}


def test_a_killed_authorization_service_is_restarted_and_requests_recover(launcher: Launcher) -> None:
    url, headers = decided_by_the_service(launcher)
    served = httpx.get(url, headers=headers, timeout=5)
    assert served.status_code == 200, served.text
    assert served.json()["headers"]["x-stoa-identity"]  # signed by the service: it decided
    state = launcher.state()
    killed = state["processes"]["authz"]["pid"]
    assert state["processes"]["authz"]["restarts"] == 0

    os.killpg(killed, signal.SIGKILL)
    wait_until(lambda: not alive(killed), 10, "the authorization service gone")
    # Restarted no sooner than the first delay: until then its routes answer 503.
    assert httpx.get(url, headers=headers, timeout=5).status_code == 503

    def recovered() -> bool:
        return httpx.get(url, headers=headers, timeout=5).status_code == 200

    wait_until(recovered, RECOVERY_TIMEOUT_S, "a 200 through Envoy again", interval=POLL_INTERVAL_S)
    authz = wait_until(
        lambda: (a := launcher.state()["processes"]["authz"])["restarts"] == 1 and a,
        10,
        "the restart counted in .stoa/estate.json",
    )
    assert authz["pid"] != killed
    assert alive(authz["pid"])
    output = launcher.output()
    assert f"authz (pid {killed}) exited" in output
    assert "killed by signal 9" in output
    assert f"authz restarted (pid {authz['pid']}, restart 1)" in output
    status = subprocess.run(
        [console_script("stoa-estate"), "status"],
        cwd=launcher.cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert f"pid {authz['pid']}" in status
    assert "restarts 1" in status


def test_the_console_is_printed_served_and_the_demo_tenant_admin_signs_in(launcher: Launcher) -> None:
    state = launcher.state()
    console = state["console_url"]
    assert console == f"{state['cp_url']}/console"
    printed = f"console         {console}   (sign in as admin / admin: platform admin; alice / alice:"
    # The state file is written just before the first screen is printed.
    wait_until(lambda: printed in launcher.output(), 10, "the console's line on the first screen")
    page = httpx.get(console, timeout=5)
    assert page.status_code == 200
    assert '<script type="module" src="/console/static/app.js">' in page.text
    config = httpx.get(f"{console}/config.json", timeout=5).json()
    assert config["issuer"] == state["issuer_url"]
    # The console's sign-in, by hand: authorization code + PKCE at the dev identity provider.
    provider = httpx.get(f"{config['issuer']}/.well-known/openid-configuration", timeout=5).json()
    verifier = secrets.token_urlsafe(48)
    redirect_uri = f"{console}/callback"
    answer = httpx.post(
        provider["authorization_endpoint"],
        data={
            "response_type": "code",
            "client_id": config["client_id"],
            "redirect_uri": redirect_uri,
            "state": "launcher",
            "code_challenge": s256(verifier),
            "code_challenge_method": "S256",
            "username": "alice",
            "password": "alice",
        },
        timeout=5,
    )
    assert answer.status_code == 303, answer.text
    code = httpx.URL(answer.headers["location"]).params["code"]
    token = httpx.post(
        provider["token_endpoint"],
        data={
            "grant_type": "authorization_code",
            "code": code,
            "client_id": config["client_id"],
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        },
        timeout=5,
    ).json()["access_token"]
    with CPClient(state["cp_url"], token, timeout=5) as signed_in:
        apis = signed_in.apis(state["demo_tenant"])
    assert "echo" in [api["api_id"] for api in apis]


def test_quick_stop_signals_stop_the_launcher_and_every_process_it_started(launcher: Launcher) -> None:
    started = launcher.pids()
    assert set(started) == {"postgres", "cp", "link", "authz", "proc", "mcp", "envoy"}
    assert all(alive(pid) for pid in started.values())

    # Back to back, as a terminal's process group and a wrapper forwarding them deliver them.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
        os.killpg(launcher.proc.pid, signum)

    try:
        code = launcher.proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"stoa-estate run still running {STOP_TIMEOUT_S} s after the signals")
    assert code == 0, launcher.output()
    left = wait_until(
        lambda: (
            not [n for n, pid in started.items() if alive(pid)]
            and not processes_mentioning(str(launcher.cwd))
        ),
        10,
        "every process the launcher started to be gone",
    )
    assert left
    assert not launcher.state_file.exists()
    assert "stopping ..." in launcher.output()
