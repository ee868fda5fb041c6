"""A site: the on-premises half of the estate for one gateway — a Link, a real Envoy, and in front of
the upstream either the allow-all Check witness or the real `stoa-authz` (and, when asked, the
processing service `stoa-proc`) — for a CP given by URL.

The estate runs one for its own CP; the guard tests put one behind a scripted CP.

    with Site(run_dir=d, cp_url=cp.url, gateway_id="gw-1", credential=c, authz="service") as site:
        site.gateway_url, site.link_http_url, site.authz_decisions()
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from stoa_harness.envoy import EnvoyProcess
from stoa_harness.lifecycle import Lifecycle
from stoa_harness.ports import free_port
from stoa_harness.processes import SupervisedProcess, tcp_accepting
from stoa_harness.wait import wait_until
from stoa_harness.witness import CheckWitness

AuthzKind = Literal["witness", "service"]
PROC_SAN = "spiffe://stoa.local/ext-proc"
MCP_SAN = "spiffe://stoa.local/mcp"


def console_script(name: str) -> str:
    """A workspace console script: next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: run `uv sync --all-packages`")
    return found


def _events(process: SupervisedProcess, name: str) -> list[dict[str, Any]]:
    lines = process.log_path.read_text(errors="replace").splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return [e for e in events if name in (e.get("event"), e.get("message"))]


def http_ok(url: str) -> bool:
    """True when `url` answers 200 (a readiness probe)."""
    return httpx.get(url, timeout=1.0).status_code == 200


class Site(Lifecycle):
    """Link + Envoy + the authorization stand-in (witness) or the real `stoa-authz`, for one gateway."""

    def __init__(
        self,
        *,
        run_dir: Path,
        cp_url: str,
        gateway_id: str,
        credential: str,
        authz: AuthzKind = "witness",
        link_env: Mapping[str, str] | None = None,
        authz_env: Mapping[str, str] | None = None,
        proc: bool = False,
        proc_env: Mapping[str, str] | None = None,
        mcp_env: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
        envoy_drain_time_s: int = 1,
    ) -> None:
        self.run_dir = run_dir
        self.cp_url = cp_url
        self.gateway_id = gateway_id
        self.credential = credential
        self.authz_kind = authz
        self.extra_link_env = dict(link_env or {})
        self.extra_authz_env = dict(authz_env or {})
        self.proc_enabled = proc
        self.extra_proc_env = dict(proc_env or {})
        # The MCP module runs when given its settings (at least STOA_MCP_TRUSTED_KEYS); it needs
        # stoa-authz, whose envelope names its callers.
        self.mcp_enabled = mcp_env is not None
        self.extra_mcp_env = dict(mcp_env or {})
        if self.mcp_enabled and authz != "service":
            raise ValueError(
                "the MCP module needs stoa-authz (authz='service'): it signs the identity envelope"
            )
        self.start_timeout = start_timeout
        self.envoy_drain_time_s = envoy_drain_time_s
        self.tls_dir = run_dir / "tls"
        self.ads_port = free_port()
        self.listener_port = free_port()
        self.envoy_admin_port = free_port()
        self.authz_http_port = free_port()
        self.authz_grpc_port = free_port()
        self.link_http_port = free_port()
        self.proc_grpc_port = free_port()
        self.proc_http_port = free_port()
        self.mcp_port = free_port()
        self.mcp_http_port = free_port()
        self.witness: CheckWitness | None = None
        self.authz: SupervisedProcess | None = None
        self.proc: SupervisedProcess | None = None
        self.mcp: SupervisedProcess | None = None
        self.link: SupervisedProcess | None = None
        self.envoy: EnvoyProcess | None = None
        self._stack = contextlib.ExitStack()

    @property
    def ads_address(self) -> str:
        return f"127.0.0.1:{self.ads_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.listener_port}"

    @property
    def ext_authz_address(self) -> str:
        if self.witness is not None:
            return self.witness.address
        return self.authz_env["STOA_AUTHZ_GRPC_ADDRESS"]

    @property
    def link_env(self) -> dict[str, str]:
        return {
            "STOA_LINK_CP_URL": self.cp_url,
            "STOA_LINK_GATEWAY_ID": self.gateway_id,
            "STOA_LINK_GATEWAY_CREDENTIAL": self.credential,
            "STOA_LINK_ADS_ADDRESS": self.ads_address,
            "STOA_LINK_TLS_DIR": str(self.tls_dir),
            # The witness has no ADS client certificate: no authorization-service client expected.
            "STOA_LINK_AUTHZ_SAN": "" if self.authz_kind == "witness" else "spiffe://stoa.local/ext-authz",
            "STOA_LINK_LISTENER_ADDRESS": "127.0.0.1",
            "STOA_LINK_LISTENER_PORT": str(self.listener_port),
            "STOA_LINK_EXT_AUTHZ_ADDRESS": self.ext_authz_address,
            "STOA_LINK_PROC_SAN": PROC_SAN if self.proc_enabled else "",
            "STOA_LINK_EXT_PROC_ADDRESS": f"127.0.0.1:{self.proc_grpc_port}",
            "STOA_LINK_MCP_SAN": MCP_SAN if self.mcp_enabled else "",
            "STOA_LINK_MCP_ADDRESS": f"127.0.0.1:{self.mcp_port}",
            "STOA_LINK_STATE_DIR": str(self.run_dir / "link-state"),
            "STOA_LINK_ENVOY_ADMIN_PORT": str(self.envoy_admin_port),
            "STOA_LINK_ENV": "development",
            "STOA_LINK_HTTP_ADDRESS": f"127.0.0.1:{self.link_http_port}",
            # The first publication's deadline also covers Envoy and stoa-authz starting and
            # connecting; 10 s (the default) is not enough on a loaded 2-core machine. It only
            # bounds a failure: an ACK or NACK ends the wait as soon as it arrives.
            "STOA_LINK_ACK_TIMEOUT_S": "30",
            **self.decision_settings,
            **self.extra_link_env,
        }

    @property
    def decision_settings(self) -> dict[str, str]:
        """The service's decision settings, given to the Link too so that Envoy decides as it does
        (a deployment sets both from the same values). The witness decides nothing: none."""
        if self.authz_kind == "witness":
            return {}
        authz = self.authz_env
        return {
            f"STOA_LINK_{name}": authz[f"STOA_AUTHZ_{name}"]
            for name in ("AUDIENCE", "REQUIRED_SCOPES", "TENANT_CLAIM", "MAX_TOKEN_LIFETIME_S")
            if f"STOA_AUTHZ_{name}" in authz
        }

    def _ads_client_env(self, prefix: str, certificate: str) -> dict[str, str]:
        """What each of the Link's ADS clients (stoa-authz, stoa-proc, stoa-mcp) is given: the ADS
        address, its client certificate `certificate` and the CA, the development environment."""
        return {
            f"{prefix}_ADS_ADDRESS": self.ads_address,
            f"{prefix}_TLS_CA": str(self.tls_dir / "ca.pem"),
            f"{prefix}_TLS_CERT": str(self.tls_dir / f"{certificate}.pem"),
            f"{prefix}_TLS_KEY": str(self.tls_dir / f"{certificate}-key.pem"),
            "STOA_ENV": "development",
        }

    @property
    def authz_env(self) -> dict[str, str]:
        return {
            "STOA_AUTHZ_GRPC_ADDRESS": f"127.0.0.1:{self.authz_grpc_port}",
            "STOA_AUTHZ_HTTP_ADDRESS": f"127.0.0.1:{self.authz_http_port}",
            **self._ads_client_env("STOA_AUTHZ", "authz-client"),
            **self.extra_authz_env,
        }

    @property
    def proc_env(self) -> dict[str, str]:
        return {
            "STOA_PROC_GRPC_ADDRESS": f"127.0.0.1:{self.proc_grpc_port}",
            "STOA_PROC_HTTP_ADDRESS": f"127.0.0.1:{self.proc_http_port}",
            **self._ads_client_env("STOA_PROC", "proc-client"),
            **self.extra_proc_env,
        }

    @property
    def mcp_env(self) -> dict[str, str]:
        return {
            "STOA_MCP_MCP_ADDRESS": f"127.0.0.1:{self.mcp_port}",
            "STOA_MCP_HTTP_ADDRESS": f"127.0.0.1:{self.mcp_http_port}",
            **self._ads_client_env("STOA_MCP", "mcp-client"),
            "STOA_MCP_GATEWAY_ID": self.gateway_id,
            "STOA_MCP_ENVELOPE_JWKS_URL": f"{self.authz_http_url}/.well-known/jwks.json",
            # The gateway is reached on loopback only.
            "STOA_MCP_ALLOWED_HOSTS": "127.0.0.1:*,localhost:*",
            "STOA_MCP_ALLOWED_ORIGINS": "http://127.0.0.1:*,http://localhost:*",
            **self.extra_mcp_env,
        }

    @property
    def mcp_http_url(self) -> str:
        """The MCP module's operator endpoint (/health/live, /health/ready, /metrics)."""
        return f"http://127.0.0.1:{self.mcp_http_port}"

    def mcp_events(self, name: str) -> list[dict[str, Any]]:
        """The JSON events the MCP module logged so far whose `message` is `name`, oldest first."""
        assert self.mcp is not None, "this site runs no MCP module"
        return _events(self.mcp, name)

    @property
    def proc_http_url(self) -> str:
        return f"http://127.0.0.1:{self.proc_http_port}"

    def proc_events(self, name: str) -> list[dict[str, Any]]:
        """The JSON events `stoa-proc` logged so far whose `event` or `message` is `name`, oldest first."""
        assert self.proc is not None, "this site runs no processing service"
        lines = self.proc.log_path.read_text(errors="replace").splitlines()
        events = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in events if name in (e.get("event"), e.get("message"))]

    @property
    def link_http_url(self) -> str:
        """The Link's operator endpoint (/health/live, /health/ready, /metrics)."""
        return f"http://127.0.0.1:{self.link_http_port}"

    @property
    def authz_http_url(self) -> str:
        return f"http://127.0.0.1:{self.authz_http_port}"

    def wait_authz_ready(self, timeout: float = 30.0) -> None:
        """Until `stoa-authz` says ready (it holds a policy set), which is later than its start."""
        url = f"{self.authz_http_url}/health/ready"
        wait_until(lambda: http_ok(url), timeout, "stoa-authz ready")

    def authz_decisions(
        self, *, direct: Callable[[dict[str, Any]], bool] | None = None, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """The `ext_authz_decision` events of stoa-authz, once its log holds one for every Check
        Envoy had answered so far: the service writes that log buffered, a moment after it answers.
        Events matching `direct` (Checks a test sent to the service itself) are left out."""
        assert self.envoy is not None
        answered = self.envoy.counters(r"^http\..*\.ext_authz\.(ok|denied)$")

        def logged() -> tuple[list[dict[str, Any]]] | None:
            events = self.authz_events("ext_authz_decision")
            through_envoy = [e for e in events if direct is None or not direct(e)]
            return (through_envoy,) if len(through_envoy) >= answered else None

        [events] = wait_until(logged, timeout, f"{answered} decision(s) in the stoa-authz log")
        return events

    def authz_events(self, name: str) -> list[dict[str, Any]]:
        """The JSON events `stoa-authz` logged so far whose `event` or `message` is `name`, oldest first."""
        assert self.authz is not None, "this site runs the witness, not stoa-authz"
        return _events(self.authz, name)

    def link_events(self, name: str) -> list[dict[str, Any]]:
        """The JSON events the Link logged so far whose `event` is `name`, oldest first."""
        assert self.link is not None
        return _events(self.link, name)

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        link_cli = console_script("stoa-link")
        if self.authz_kind == "witness":
            self.witness = self._stack.enter_context(CheckWitness())
        self._run_once("certs", [link_cli, "certs", "--out", str(self.tls_dir)])
        self.link = self._supervised(
            "link", [link_cli, "run"], self.link_env, lambda: tcp_accepting("127.0.0.1", self.ads_port)
        )
        if self.mcp_enabled:
            # Its imports are slow on a loaded machine: it starts alongside the others, and is
            # waited for once Envoy is up.
            self.mcp = self._supervised(
                "mcp",
                [console_script("stoa-mcp")],
                self.mcp_env,
                lambda: (
                    tcp_accepting("127.0.0.1", self.mcp_http_port)
                    and tcp_accepting("127.0.0.1", self.mcp_port)
                ),
                wait_ready=False,
            )
        if self.authz_kind == "service":
            self.authz = self._supervised(
                "authz",
                [console_script("stoa-authz")],
                self.authz_env,
                lambda: http_ok(f"{self.authz_http_url}/health/live"),
            )
        if self.proc_enabled:
            self.proc = self._supervised(
                "proc",
                [console_script("stoa-proc")],
                self.proc_env,
                lambda: http_ok(f"{self.proc_http_url}/health/live"),
            )
        bootstrap = self.run_dir / "envoy-bootstrap.yaml"
        self._run_once("bootstrap", [link_cli, "bootstrap", "--out", str(bootstrap)])
        self.envoy = EnvoyProcess(
            bootstrap, self.envoy_admin_port, self.run_dir / "envoy.log", drain_time_s=self.envoy_drain_time_s
        )
        self._stack.callback(self.envoy.stop)
        self.envoy.start(ready_timeout=self.start_timeout)
        if self.mcp is not None:
            mcp = self.mcp
            wait_until(mcp._ready_or_dead, self.start_timeout, "stoa-mcp ready")

    def _run_once(self, name: str, argv: Sequence[str]) -> None:
        """A Link subcommand that runs to completion (certs, bootstrap) with the Link's settings."""
        proc = SupervisedProcess(name, argv, log_dir=self.run_dir, env=self.link_env)
        proc.start()
        assert proc.proc is not None
        try:
            code = proc.proc.wait(timeout=self.start_timeout)
        finally:
            proc.stop()  # only does something when the wait timed out: nothing is left running
        if code != 0:
            raise RuntimeError(f"stoa-link {name} failed ({code})\n{proc.log_tail()}")

    def _supervised(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        ready: Callable[[], bool],
        *,
        wait_ready: bool = True,
    ) -> SupervisedProcess:
        """A service of the site, started (and waited for unless `wait_ready` is False), stopped with
        the site."""
        process = SupervisedProcess(
            name, argv, log_dir=self.run_dir, env=env, ready=ready, ready_timeout=self.start_timeout
        )
        self._stack.callback(process.stop)
        process.start(wait_ready=wait_ready)
        return process

    def stop(self) -> None:
        self._stack.close()
