"""`stoa-link run | bootstrap | certs`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from pydantic import ValidationError
from stoa_ops import logs
from stoa_ops.address import is_loopback
from stoa_translate.snapshot import (
    AUTHZ_POLICY_SET,
    ENVOY_TYPES,
    MCP_POLICY_SET,
    PROC_POLICY_SET,
    TOOL_PERMISSIONS,
)

from stoa_link import bootstrap, certs
from stoa_link.settings import LinkSettings

log = logging.getLogger("stoa_link.cli")


class StartupError(Exception):
    """A setting or file that keeps the Link from starting; the message says which and why."""


def load_settings() -> LinkSettings:
    try:
        return LinkSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"STOA_LINK_{'.'.join(map(str, err['loc'])).upper()}: {err['msg']}" for err in exc.errors()
        )
        raise StartupError(f"invalid settings: {problems}") from None


def _run(settings: LinkSettings) -> None:
    from envoy.service.accesslog.v3 import als_pb2_grpc
    from stoa_ops.endpoint import OperatorEndpoint
    from stoa_translate import TranslateOptions, Translator

    from stoa_link.ads import AdsServer, TlsMaterial
    from stoa_link.agent import Agent, InventoryStore, run_agent
    from stoa_link.cp_client import CpClient
    from stoa_link.envoy_decisions import EnvoyDecisions
    from stoa_link.health import readiness
    from stoa_link.metrics import link_registry
    from stoa_link.reporter import Reporter

    try:
        settings.require_run_settings()
        tls = TlsMaterial.server_from_dir(settings.tls_dir)
        http_endpoint = settings.http_endpoint
        options = TranslateOptions(
            listener_address=settings.listener_address,
            listener_port=settings.listener_port,
            ext_authz_address=settings.ext_authz_address,
            ext_authz_timeout_ms=settings.ext_authz_timeout_ms,
            extra_identity_headers=settings.identity_headers_added,
            ext_proc_address=settings.ext_proc_address,
            mcp_address=settings.mcp_address,
            decision_placement=settings.decision_placement,
            audience=settings.audience,
            required_scopes=tuple(settings.required_scopes),
            tenant_claim=settings.tenant_claim,
            max_token_lifetime_s=settings.max_token_lifetime_s,
            decision_log_cluster=bootstrap.ADS_CLUSTER,
            # Scoped RDS needs delta xDS: over state of the world a new scope re-sends every scope.
            route_scopes=settings.xds == "delta",
        )
    except (ValueError, FileNotFoundError) as exc:
        raise StartupError(str(exc)) from None
    if settings.env == "production" and certs.issued_by_dev_ca(tls.cert_pem):
        raise StartupError(
            f"STOA_LINK_ENV=production but {settings.tls_dir / certs.SERVER_CERT_FILE} was issued by the "
            f"{certs.DEV_CA_NAME!r} (from `stoa-link certs`): install certificates from your own CA"
        )
    identities = {settings.envoy_san: ENVOY_TYPES}
    if settings.authz_san:
        identities[settings.authz_san] = (AUTHZ_POLICY_SET,)
    if settings.proc_san:
        identities[settings.proc_san] = (PROC_POLICY_SET,)
    if settings.mcp_san:
        identities[settings.mcp_san] = (MCP_POLICY_SET, TOOL_PERMISSIONS)
    decisions = EnvoyDecisions(settings.envoy_san, lambda: ads.acked_snapshot)
    ads = AdsServer(
        settings.ads_address,
        tls,
        identities,
        settings.ack_timeout_s,
        services=[lambda server: als_pb2_grpc.add_AccessLogServiceServicer_to_server(decisions, server)],
    )
    credential = settings.gateway_credential.get_secret_value()
    reporter = Reporter(settings.cp_url, settings.gateway_id, credential, settings=options.to_settings())
    cp = CpClient(settings.cp_url, settings.gateway_id, credential, deltas=settings.deltas)
    try:
        store = InventoryStore(settings.state_dir)
        translator = Translator(options)
        agent = Agent(
            settings.gateway_id,
            ads,
            reporter,
            translator.translate,
            store,
            translator.translate_change,
            translator.prepare_changes,
        )
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    endpoints = OperatorEndpoint(
        lambda: readiness(ads, lambda: translator.unkeyed),
        link_registry(agent.stats, ads, lambda: cp.stream_open, lambda: cp.refetches),
    )

    async def main() -> None:
        try:
            await ads.start()
        except (OSError, RuntimeError) as exc:
            raise StartupError(f"cannot start the ADS server on {settings.ads_address}: {exc}") from None
        http: asyncio.Server | None = None
        if http_endpoint is not None:
            host, port = http_endpoint
            if not is_loopback(host):
                log.warning(
                    "http_not_loopback",
                    extra={"fields": {"address": settings.http_address, "note": "metrics readable off-host"}},
                )
            try:
                http = await endpoints.start(host, port)
            except OSError as exc:
                await ads.stop()
                raise StartupError(
                    f"cannot start the HTTP endpoint on {settings.http_address}: {exc}"
                ) from None
            bound = http.sockets[0].getsockname()
            log.info("http_listening", extra={"fields": {"address": f"{bound[0]}:{bound[1]}"}})
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        try:
            await run_agent(agent, cp)
        finally:
            if http is not None:
                http.close()
                await http.wait_closed()
            await ads.stop()
            await cp.aclose()
            await reporter.aclose()

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stoa-link", description="The STOA Link (settings: STOA_LINK_*)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="follow the CP and serve Envoy over ADS")
    boot = sub.add_parser("bootstrap", help="write the Envoy bootstrap")
    boot.add_argument("--out", type=Path, required=True)
    boot.add_argument("--node-id", default=None, help="Envoy node id (logged only, never an identity)")
    cert = sub.add_parser("certs", help="write development certificates (never for production)")
    cert.add_argument("--out", type=Path, required=True)
    cert.add_argument("--force", action="store_true", help="replace an existing set")
    args = parser.parse_args(argv)
    logs.configure(quiet=["httpx"])
    try:
        settings = load_settings()
        if args.command == "run":
            _run(settings)
        elif args.command == "bootstrap":
            try:
                bootstrap.write(settings, args.out, args.node_id)
            except FileNotFoundError as exc:
                raise StartupError(str(exc)) from None
            print(f"wrote {args.out}")
        else:
            try:
                written = certs.write_dev_certs(
                    args.out,
                    settings.envoy_san,
                    settings.authz_san,
                    args.force,
                    settings.proc_san,
                    settings.mcp_san,
                )
            except FileExistsError as exc:
                raise StartupError(str(exc)) from None
            print(f"{'wrote' if written else 'kept existing'} development certificates in {args.out}")
    except StartupError as exc:
        print(f"stoa-link {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
