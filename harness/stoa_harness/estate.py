"""The local estate: embedded PostgreSQL + CP + echo upstream + a site (Link + Envoy + Check witness or
stoa-authz) for the CP's gateway `gw-1`.

Every part listens on a free loopback port; subprocesses log to `<run_dir>/<name>.log`; in-process
servers (upstream, witness) run on their own threads. Teardown runs in reverse order of start, also
when start-up fails half-way. The CP is reached through `estate.admin`, a `CPClient` holding the
admin token and defaulting to the estate's gateway.

    with EmbeddedPostgres() as pg, Estate(postgres=pg) as estate:
        gen = estate.publish("echo", tenant_id="acme")     # tenant (if new) + API + deployment
        estate.admin.wait_synced(gen)
        estate.gateway.get(estate.url("/apis/echo/hello"))  # through the real Envoy
        estate.upstream.arrivals(), estate.witness.checks()
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stoa_harness.cp_client import CPClient
from stoa_harness.envoy import EnvoyProcess
from stoa_harness.lifecycle import Lifecycle
from stoa_harness.llm import FakeLLM
from stoa_harness.ports import free_port
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.processes import SupervisedProcess
from stoa_harness.site import AuthzKind, Site, console_script, http_ok
from stoa_harness.upstream import EchoUpstream
from stoa_harness.witness import CheckWitness


@dataclass(frozen=True)
class EstateOptions:
    authz: AuthzKind = "witness"
    gateway_id: str = "gw-1"
    gateway_name: str = "Local gateway"
    link_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_LINK_* settings
    cp_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_CP_* settings
    authz_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_AUTHZ_* settings
    # Run the processing service (stoa-proc) and have the Link serve it its policy set.
    proc: bool = False
    proc_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_PROC_* settings
    # Run the MCP module (needs authz="service"): the CP signs tool permissions with a key of the
    # run directory's `mcp-signing/`, which the module pins.
    mcp: bool = False
    mcp_env: Mapping[str, str] = field(default_factory=dict)  # extra STOA_MCP_* settings
    start_timeout: float = 60.0
    # Envoy's --drain-time-s: how long connections keep a replaced listener (1 s: tests see changes at once).
    envoy_drain_time_s: int = 1


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
        # An OpenAI-compatible model upstream, for chat-completion routes.
        self.llm = FakeLLM()
        self.cp: SupervisedProcess | None = None
        self.site: Site | None = None
        self.signing_key_dir = self.run_dir / "mcp-signing"
        self.trusted_keys = self.run_dir / "mcp-trusted-keys.json"
        self.admin = CPClient(
            self.cp_url, self.admin_token, gateway_id=self.gateway_id, describe=self._describe_wait
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
    def started_site(self) -> Site:
        """The site of a started estate (its services' logs and events)."""
        assert self.site is not None, "estate not started"
        return self.site

    def last_authz_reason(self) -> str:
        """The reason of the latest decision stoa-authz logged for a request through Envoy."""
        return str(self.started_site.authz_decisions()[-1]["reason"])

    @property
    def gateway_url(self) -> str:
        return self.started_site.gateway_url

    @property
    def envoy(self) -> EnvoyProcess:
        assert self.started_site.envoy is not None
        return self.started_site.envoy

    @property
    def envoy_admin_url(self) -> str:
        return self.envoy.admin_url

    @property
    def witness(self) -> CheckWitness:
        assert self.started_site.witness is not None, "this estate runs stoa-authz, not the witness"
        return self.started_site.witness

    @property
    def link(self) -> SupervisedProcess:
        assert self.started_site.link is not None
        return self.started_site.link

    @property
    def link_http_url(self) -> str:
        return self.started_site.link_http_url

    @property
    def proc(self) -> SupervisedProcess:
        assert self.started_site.proc is not None, "this estate runs no processing service"
        return self.started_site.proc

    @property
    def mcp(self) -> SupervisedProcess:
        assert self.started_site.mcp is not None, "this estate runs no MCP module"
        return self.started_site.mcp

    @property
    def mcp_http_url(self) -> str:
        return self.started_site.mcp_http_url

    def mcp_url(self, path_prefix: str) -> str:
        """The MCP endpoint of an MCP route through the real Envoy."""
        return self.url(path_prefix)

    def rotate_signing_key(self) -> str:
        """Pin a new tool-permission signing key at the module (the old one stays pinned: overlap)
        and hand it to the CP (it signs with the newest from its next round). The new kid; the
        module reads its pinned keys at start, so it is restarted with both."""
        kid = self._new_signing_key()
        self.mcp.stop()
        self.mcp.start()
        return kid

    def _new_signing_key(self) -> str:
        from stoa_cp.permissions import public_jwk, write_key

        number = len(list(self.signing_key_dir.glob("*.pem"))) + 1
        # Written outside the CP's *.pem pattern and pinned at the module before the CP signs with it.
        staged = self.signing_key_dir / f"{number:04d}.pem.new"
        kid = write_key(staged)
        pinned = json.loads(self.trusted_keys.read_text())["keys"] if self.trusted_keys.exists() else []
        self.trusted_keys.write_text(json.dumps({"keys": [*pinned, public_jwk(staged)]}))
        staged.rename(self.signing_key_dir / f"{number:04d}.pem")
        return kid

    def processes(self) -> list[SupervisedProcess]:
        """The subprocesses this estate started and keeps up (PostgreSQL aside): CP, Link, stoa-authz,
        stoa-proc and stoa-mcp when they run, Envoy."""
        site = self.started_site
        candidates = (self.cp, site.link, site.authz, site.proc, site.mcp, site.envoy)
        return [p for p in candidates if p is not None]

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
        self._stack.enter_context(self.llm)
        mcp_cp_env: dict[str, str] = {}
        if self.options.mcp:
            self.signing_key_dir.mkdir(parents=True, exist_ok=True)
            self._new_signing_key()
            mcp_cp_env = {"STOA_CP_MCP_SIGNING_KEY_DIR": str(self.signing_key_dir)}
        self.cp = SupervisedProcess(
            "cp",
            [console_script("stoa-cp")],
            log_dir=self.run_dir,
            env={
                "STOA_CP_DATABASE_URL": self.database_url,
                "STOA_CP_ADMIN_TOKENS": self.admin_token,
                "STOA_CP_HOST": "127.0.0.1",
                "STOA_CP_PORT": str(self.cp_port),
                **mcp_cp_env,
                **self.options.cp_env,
            },
            ready=lambda: http_ok(f"{self.cp_url}/health/ready"),
            ready_timeout=self.options.start_timeout,
        )
        self._stack.callback(self.cp.stop)
        self.cp.start()
        created = self.admin.create_gateway(self.gateway_id, self.options.gateway_name)
        self.gateway_credential = created["credential"]
        self.site = Site(
            run_dir=self.run_dir,
            cp_url=self.cp_url,
            gateway_id=self.gateway_id,
            credential=self.gateway_credential,
            authz=self.options.authz,
            link_env=self.options.link_env,
            authz_env={"STOA_AUTHZ_DATABASE_URL": self.database_url, **self.options.authz_env},
            proc=self.options.proc,
            proc_env={"STOA_PROC_DATABASE_URL": self.database_url, **self.options.proc_env},
            mcp_env={
                "STOA_MCP_TRUSTED_KEYS": str(self.trusted_keys),
                # MCP budgets are counted in the estate's PostgreSQL (the quota store).
                "STOA_MCP_DATABASE_URL": self.database_url,
                **self.options.mcp_env,
            }
            if self.options.mcp
            else None,
            start_timeout=self.options.start_timeout,
            envoy_drain_time_s=self.options.envoy_drain_time_s,
        )
        self._stack.enter_context(self.site)
        # A fresh gateway (generation 1, no routes) must reach SYNCED before anyone uses it. With a short
        # ACK deadline, Envoy or stoa-authz may connect after it: FAILED first, then SYNCED.
        self.admin.wait_synced(timeout=self.options.start_timeout, past_failed=True)

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

    # -- the CP, with this estate's defaults ------------------------------------------------------
    def create_api(
        self,
        api_id: str,
        *,
        tenant_id: str = "demo",
        upstream_url: str | None = None,
        methods: Sequence[str] = ("GET",),
        **fields: Any,
    ) -> dict[str, Any]:
        """An API of `tenant_id` (default `demo`) in front of this estate's echo upstream unless told
        otherwise; the API as stored."""
        return self.admin.create_api(
            api_id,
            tenant_id=tenant_id,
            upstream_url=upstream_url or self.upstream.url,
            methods=methods,
            **fields,
        )

    def publish(self, api_id: str, *, tenant_id: str = "demo", **api: Any) -> int:
        """Tenant (when new) + API (`create_api`) + deployment on this estate's gateway; the generation
        to wait for."""
        self.admin.create_tenant(tenant_id, exist_ok=True)
        self.create_api(api_id, tenant_id=tenant_id, **api)
        return int(self.admin.deploy(api_id))

    def inventory(self) -> dict[str, Any]:
        """The gateway's inventory as its Link fetches it (with the gateway's credential)."""
        with CPClient(self.cp_url, self.gateway_credential, gateway_id=self.gateway_id) as link_view:
            return link_view.inventory()

    def _describe_wait(self, gateway_id: str) -> str:
        """What a timed-out wait on this estate's gateway adds to its message: the Link's last lines."""
        if gateway_id != self.gateway_id or self.site is None or self.site.link is None:
            return ""
        return self.site.link.log_tail(15)
