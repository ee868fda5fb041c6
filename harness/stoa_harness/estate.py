"""The local estate: embedded PostgreSQL + CP + echo upstream + (Check witness | stoa-authz) + Link + Envoy.

Every part listens on a free loopback port; subprocesses log to `<run_dir>/<name>.log`; in-process
servers (upstream, witness) run on their own threads. Teardown runs in reverse order of start, also
when start-up fails half-way.

    with EmbeddedPostgres() as pg, Estate(postgres=pg) as estate:
        gen = estate.publish("echo", tenant_id="acme")     # tenant (if new) + API + deployment
        estate.wait_synced(gen)
        estate.gateway.get("/apis/echo/hello")              # through the real Envoy
        estate.upstream.arrivals(), estate.witness.checks()

`Site` is the on-premises half alone (Link + Envoy + witness or stoa-authz) for a CP given by URL,
so the guard tests can put a scripted CP in front of a real Link and a real Envoy.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from stoa_harness.envoy import EnvoyProcess
from stoa_harness.lifecycle import Lifecycle
from stoa_harness.ports import free_port
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.processes import SupervisedProcess, tcp_accepting
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_harness.witness import CheckWitness

AuthzKind = Literal["witness", "service"]


class CPError(AssertionError):
    """The CP answered an estate helper with an error status (the message carries its problem body)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        super().__init__(
            f"{response.request.method} {response.request.url.path} -> {response.status_code}: "
            f"{response.text}"
        )


class SyncFailed(AssertionError):
    """The gateway reached FAILED for the generation a helper waited on."""


def console_script(name: str) -> str:
    """A workspace console script: next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: run `uv sync --all-packages`")
    return found


def checked(response: httpx.Response) -> Any:
    """The JSON body of a 2xx answer (None when empty); CPError otherwise."""
    if not response.is_success:
        raise CPError(response)
    return response.json() if response.content else None


def _http_ok(url: str) -> bool:
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
        start_timeout: float = 60.0,
    ) -> None:
        self.run_dir = run_dir
        self.cp_url = cp_url
        self.gateway_id = gateway_id
        self.credential = credential
        self.authz_kind = authz
        self.extra_link_env = dict(link_env or {})
        self.extra_authz_env = dict(authz_env or {})
        self.start_timeout = start_timeout
        self.tls_dir = run_dir / "tls"
        self.ads_port = free_port()
        self.listener_port = free_port()
        self.envoy_admin_port = free_port()
        self.authz_http_port = free_port()
        self.authz_grpc_port = free_port()
        self.link_http_port = free_port()
        self.witness: CheckWitness | None = None
        self.authz: SupervisedProcess | None = None
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
            "STOA_LINK_STATE_DIR": str(self.run_dir / "link-state"),
            "STOA_LINK_ENVOY_ADMIN_PORT": str(self.envoy_admin_port),
            "STOA_LINK_ENV": "development",
            "STOA_LINK_HTTP_ADDRESS": f"127.0.0.1:{self.link_http_port}",
            # The first publication's deadline also covers Envoy and stoa-authz starting and
            # connecting; 10 s (the default) is not enough on a loaded 2-core machine. It only
            # bounds a failure: an ACK or NACK ends the wait as soon as it arrives.
            "STOA_LINK_ACK_TIMEOUT_S": "30",
            **self.extra_link_env,
        }

    @property
    def authz_env(self) -> dict[str, str]:
        return {
            "STOA_AUTHZ_GRPC_ADDRESS": f"127.0.0.1:{self.authz_grpc_port}",
            "STOA_AUTHZ_HTTP_ADDRESS": f"127.0.0.1:{self.authz_http_port}",
            "STOA_AUTHZ_ADS_ADDRESS": self.ads_address,
            "STOA_AUTHZ_TLS_CA": str(self.tls_dir / "ca.pem"),
            "STOA_AUTHZ_TLS_CERT": str(self.tls_dir / "authz-client.pem"),
            "STOA_AUTHZ_TLS_KEY": str(self.tls_dir / "authz-client-key.pem"),
            "STOA_ENV": "development",
            **self.extra_authz_env,
        }

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
        wait_until(lambda: _http_ok(url), timeout, "stoa-authz ready")

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
        lines = self.authz.log_path.read_text(errors="replace").splitlines()
        events = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in events if name in (e.get("event"), e.get("message"))]

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        link_cli = console_script("stoa-link")
        if self.authz_kind == "witness":
            self.witness = self._stack.enter_context(CheckWitness())
        self._run_once("certs", [link_cli, "certs", "--out", str(self.tls_dir)])
        self.link = SupervisedProcess(
            "link",
            [link_cli, "run"],
            log_dir=self.run_dir,
            env=self.link_env,
            ready=lambda: tcp_accepting("127.0.0.1", self.ads_port),
            ready_timeout=self.start_timeout,
        )
        self._stack.callback(self.link.stop)
        self.link.start()
        if self.authz_kind == "service":
            self.authz = SupervisedProcess(
                "authz",
                [console_script("stoa-authz")],
                log_dir=self.run_dir,
                env=self.authz_env,
                ready=lambda: _http_ok(f"{self.authz_http_url}/health/live"),
                ready_timeout=self.start_timeout,
            )
            self._stack.callback(self.authz.stop)
            self.authz.start()
        bootstrap = self.run_dir / "envoy-bootstrap.yaml"
        self._run_once("bootstrap", [link_cli, "bootstrap", "--out", str(bootstrap)])
        self.envoy = EnvoyProcess(bootstrap, self.envoy_admin_port, self.run_dir / "envoy.log")
        self._stack.callback(self.envoy.stop)
        self.envoy.start(ready_timeout=self.start_timeout)

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

    def stop(self) -> None:
        self._stack.close()


@dataclass(frozen=True)
class EstateOptions:
    authz: AuthzKind = "witness"
    gateway_id: str = "gw-1"
    gateway_name: str = "Local gateway"
    link_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_LINK_* settings
    cp_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_CP_* settings
    authz_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_AUTHZ_* settings
    start_timeout: float = 60.0


class Estate(Lifecycle):
    def __init__(
        self,
        options: EstateOptions | None = None,
        *,
        postgres: EmbeddedPostgres | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.options = options or EstateOptions()
        self._shared_pg = postgres
        self._given_run_dir = run_dir
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix="stoa-estate-"))
        self.admin_token = secrets.token_urlsafe(24)
        self.cp_port = free_port()
        self.gateway_id = self.options.gateway_id
        self.gateway_credential = ""
        self.database_url = ""
        self.postgres: EmbeddedPostgres | None = None
        self.upstream = EchoUpstream()
        self.cp: SupervisedProcess | None = None
        self.site: Site | None = None
        self.admin = httpx.Client(
            base_url=self.cp_url, headers={"authorization": f"Bearer {self.admin_token}"}, timeout=10.0
        )
        # No keep-alive through Envoy: a listener update drains old connections, and a test must
        # never see a stale pooled connection fail instead of the answer it asserts.
        self.gateway = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10.0)
        self._stack = contextlib.ExitStack()

    # -- what tests read --------------------------------------------------------------------------
    @property
    def cp_url(self) -> str:
        return f"http://127.0.0.1:{self.cp_port}"

    @property
    def _site(self) -> Site:
        assert self.site is not None, "estate not started"
        return self.site

    @property
    def gateway_url(self) -> str:
        return self._site.gateway_url

    @property
    def envoy(self) -> EnvoyProcess:
        assert self._site.envoy is not None
        return self._site.envoy

    @property
    def envoy_admin_url(self) -> str:
        return self.envoy.admin_url

    @property
    def witness(self) -> CheckWitness:
        assert self._site.witness is not None, "this estate runs stoa-authz, not the witness"
        return self._site.witness

    @property
    def link(self) -> SupervisedProcess:
        assert self._site.link is not None
        return self._site.link

    @property
    def link_http_url(self) -> str:
        return self._site.link_http_url

    def url(self, path: str) -> str:
        """A URL on the gateway's listener (the real Envoy)."""
        return f"{self.gateway_url}{path}"

    # -- lifecycle --------------------------------------------------------------------------------
    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._stack.callback(self.admin.close)
        self._stack.callback(self.gateway.close)
        if self._shared_pg is None:
            self.postgres = self._stack.enter_context(EmbeddedPostgres())
        else:
            self.postgres = self._shared_pg
        # One database per estate: estates sharing a server never see each other's state.
        self.database_url = self.postgres.create_database(f"estate_{secrets.token_hex(6)}")
        self._stack.enter_context(self.upstream)
        self.cp = SupervisedProcess(
            "cp",
            [console_script("stoa-cp")],
            log_dir=self.run_dir,
            env={
                "STOA_CP_DATABASE_URL": self.database_url,
                "STOA_CP_ADMIN_TOKENS": self.admin_token,
                "STOA_CP_HOST": "127.0.0.1",
                "STOA_CP_PORT": str(self.cp_port),
                **self.options.cp_env,
            },
            ready=lambda: _http_ok(f"{self.cp_url}/health/ready"),
            ready_timeout=self.options.start_timeout,
        )
        self._stack.callback(self.cp.stop)
        self.cp.start()
        created = checked(
            self.admin.post(
                "/v1/gateways", json={"gateway_id": self.gateway_id, "name": self.options.gateway_name}
            )
        )
        self.gateway_credential = created["credential"]
        self.site = Site(
            run_dir=self.run_dir,
            cp_url=self.cp_url,
            gateway_id=self.gateway_id,
            credential=self.gateway_credential,
            authz=self.options.authz,
            link_env=self.options.link_env,
            authz_env=self.options.authz_env,
            start_timeout=self.options.start_timeout,
        )
        self._stack.enter_context(self.site)
        # A fresh gateway (generation 1, no routes) must reach SYNCED before anyone uses it.
        self.wait_synced(timeout=self.options.start_timeout)

    def stop(self) -> None:
        self._stack.close()
        if self._given_run_dir is None and self.run_dir.exists():
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def stop_cp(self) -> None:
        assert self.cp is not None
        self.cp.stop()

    def start_cp(self) -> None:
        assert self.cp is not None
        self.cp.start()

    # -- CP helpers (admin token) -----------------------------------------------------------------
    def create_tenant(self, tenant_id: str, name: str | None = None) -> dict[str, Any]:
        body = {"tenant_id": tenant_id, "name": name or tenant_id}
        return checked(self.admin.post("/v1/tenants", json=body))

    def ensure_tenant(self, tenant_id: str) -> None:
        tenants = checked(self.admin.get("/v1/tenants"))
        items = tenants.get("items", tenants) if isinstance(tenants, dict) else tenants
        if not any(t.get("tenant_id") == tenant_id for t in items):
            self.create_tenant(tenant_id)

    def create_api(
        self,
        api_id: str,
        *,
        tenant_id: str = "demo",
        upstream_url: str | None = None,
        methods: Sequence[str] = ("GET",),
        path_prefix: str | None = None,
        timeout_ms: int | None = None,
        auth: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "api_id": api_id,
            "name": name or api_id,
            "upstream_url": upstream_url or self.upstream.url,
            "methods": list(methods),
        }
        if path_prefix is not None:
            body["path_prefix"] = path_prefix
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        if auth is not None:
            body["auth"] = dict(auth)
        return checked(self.admin.post(f"/v1/tenants/{tenant_id}/apis", json=body))

    def deploy(self, api_id: str, gateway_id: str | None = None) -> int:
        """Activate an API on this estate's gateway (or another on the CP); its new desired generation."""
        gateway_id = gateway_id or self.gateway_id
        checked(self.admin.put(f"/v1/gateways/{gateway_id}/deployments/{api_id}"))
        return self.desired_generation(gateway_id)

    def undeploy(self, api_id: str) -> int:
        """Deactivate (tombstone) an API on this estate's gateway; the new desired generation."""
        checked(self.admin.delete(f"/v1/gateways/{self.gateway_id}/deployments/{api_id}"))
        return self.desired_generation()

    def publish(self, api_id: str, *, tenant_id: str = "demo", **api: Any) -> int:
        """Tenant (when new) + API + deployment on this gateway; the desired generation to wait for."""
        self.ensure_tenant(tenant_id)
        self.create_api(api_id, tenant_id=tenant_id, **api)
        return self.deploy(api_id)

    def add_policy(
        self,
        policy_id: str,
        policy_type: str,
        config: Mapping[str, Any],
        *,
        tenant_id: str | None = "demo",
        scope: str = "api",
        targets: Sequence[str] = (),
        gateway_id: str | None = None,
    ) -> int:
        """A tenant policy (scope tenant|api), or a gateway one when tenant_id is None (on this estate's
        gateway or `gateway_id`); that gateway's new desired generation."""
        gateway_id = gateway_id or self.gateway_id
        if tenant_id is None:
            path = f"/v1/gateways/{gateway_id}/policies"
            body: dict[str, Any] = {"policy_id": policy_id, "type": policy_type, "config": dict(config)}
        else:
            path = f"/v1/tenants/{tenant_id}/policies"
            body = {
                "policy_id": policy_id,
                "type": policy_type,
                "config": dict(config),
                "scope": scope,
                "targets": list(targets),
            }
        checked(self.admin.post(path, json=body))
        return self.desired_generation(gateway_id)

    def add_issuer(
        self,
        tenant_id: str,
        issuer: str,
        jwks_uri: str | None = None,
        *,
        jwks: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Trust `issuer` for the tenant, by `jwks_uri` (the CP fetches the keys) or inline `jwks`; the
        CP ships the keys to the site either way."""
        body: dict[str, Any] = {"issuer": issuer}
        if jwks_uri is not None:
            body["jwks_uri"] = jwks_uri
        if jwks is not None:
            body["jwks"] = dict(jwks)
        return checked(self.admin.post(f"/v1/tenants/{tenant_id}/issuers", json=body))

    def status(self, gateway_id: str | None = None) -> dict[str, Any]:
        """The status of this estate's gateway (or of another gateway on the same CP)."""
        return checked(self.admin.get(f"/v1/gateways/{gateway_id or self.gateway_id}/status"))

    def desired_generation(self, gateway_id: str | None = None) -> int:
        return int(self.status(gateway_id)["desired_generation"])

    def inventory(self) -> dict[str, Any]:
        """The gateway's inventory as the Link fetches it (with the gateway credential)."""
        return checked(
            httpx.get(
                f"{self.cp_url}/v1/gateways/{self.gateway_id}/config",
                headers={"authorization": f"Bearer {self.gateway_credential}"},
                timeout=10.0,
            )
        )

    def wait_settled(
        self, generation: int | None = None, timeout: float = 30.0, gateway_id: str | None = None
    ) -> dict[str, Any]:
        """Poll the status until `generation` (default: the desired one now) is SYNCED or FAILED."""
        gateway_id = gateway_id or self.gateway_id
        target = self.desired_generation(gateway_id) if generation is None else generation

        def settled() -> dict[str, Any] | None:
            status = self.status(gateway_id)
            if int(status["desired_generation"]) == target and status["state"] == "FAILED":
                return status
            if int(status.get("acknowledged_generation") or 0) >= target and status["state"] == "SYNCED":
                return status
            return None

        try:
            return wait_until(settled, timeout, f"gateway {gateway_id} settled at generation {target}")
        except AssertionError as exc:
            status_now = self._safe_status(gateway_id)
            link_log = self.link.log_tail(15) if gateway_id == self.gateway_id else ""
            raise AssertionError(f"{exc}; status now {status_now}\n{link_log}") from None

    def wait_synced(
        self, generation: int | None = None, timeout: float = 30.0, gateway_id: str | None = None
    ) -> dict[str, Any]:
        """The status once SYNCED at `generation` (default: the desired one now); SyncFailed if FAILED."""
        status = self.wait_settled(generation, timeout, gateway_id)
        if status["state"] != "SYNCED":
            raise SyncFailed(f"generation {status['desired_generation']} FAILED: {status.get('last_report')}")
        return status

    def wait_failed(self, generation: int | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """The status once FAILED at `generation` (its `last_report` says why); AssertionError if SYNCED."""
        status = self.wait_settled(generation, timeout)
        assert status["state"] == "FAILED", f"expected FAILED, got {status}"
        return status

    def _safe_status(self, gateway_id: str) -> Any:
        try:
            return self.status(gateway_id)
        except (httpx.HTTPError, CPError) as exc:
            return repr(exc)
