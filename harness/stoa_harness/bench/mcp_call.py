"""A `tools/call` through Envoy + the authorization service + the MCP module against a direct call of
the backing API, same run, one connection each, interleaved in blocks (so both see the same machine):
p50 and p99 of each, and what the MCP path adds at p50 (bound: ≤ 2 ms). Two calls are timed: one in a
session opened by `initialize` (protocol 2025-11-25, what handshake-era clients do) and one
self-contained request of protocol 2026-07-28 (no session: what the `mcp` client speaks by default).

The same run also times the backing API's own path through the gateway twice, to say which layer
adds what: `gateway_open` (Envoy alone: an API without a token) and `gateway_envelope` (Envoy,
jwt_authn and the authorization service's Check with the signed identity envelope: the MCP route's
own decision). `layers_p50_ms` is then Envoy's share, the Check's, and the module's (a tools/call
against `gateway_envelope`: the module's hop and its call of the API).

A loaded machine stretches every hop's scheduling, so the report also gives what is independent of
the load: the CPU time each process on the path spends per call (from /proc), beside the ratio to
the direct call.

    uv run python -m stoa_harness.bench.mcp_call          # or BENCH_ONLY=mcp make bench
    BENCH_QUICK=1 ...                                     # fewer calls

Writes `mcp.json` into the results directory (`BENCH_RESULTS_DIR`, else bench/results/<date>/).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from stoa_harness.bench.report import environment, percentile
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-bench-mcp"
TENANT = "bench"
PREFIX = "/mcp/bench"
# The backing API through the gateway: without a token, and with the MCP route's own decision.
OPEN_PREFIX = "/apis/bench-open"
ENVELOPE_PREFIX = "/apis/bench-envelope"
PROTOCOL = "2025-11-25"
MODERN = "2026-07-28"
BOUND_MS = 2.0
REPO = Path(__file__).resolve().parents[3]


def _rpc(method: str, params: dict[str, Any], id_: int | None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id_ is not None:
        message["id"] = id_
    return message


def _timed(send: Any) -> float:
    started = time.perf_counter()
    send()
    return (time.perf_counter() - started) * 1000


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` so far."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3)}


def measure(estate: Estate, token: str, calls: int, block: int = 50) -> dict[str, Any]:
    load_at_start = round(os.getloadavg()[0], 2)
    headers = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
    }
    mcp_url, direct_url = estate.url(PREFIX), f"{estate.upstream.url}/orders/1"
    open_url, envelope_url = estate.url(f"{OPEN_PREFIX}/orders/1"), estate.url(f"{ENVELOPE_PREFIX}/orders/1")
    arguments = {"name": "get_order", "arguments": {"id": "1"}}
    with httpx.Client(timeout=10) as gateway, httpx.Client(timeout=10) as direct:
        opened = gateway.post(
            mcp_url,
            headers=headers,
            json=_rpc(
                "initialize",
                {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "0"},
                },
                1,
            ),
        )
        opened.raise_for_status()
        session = {
            **headers,
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": PROTOCOL,
        }
        gateway.post(mcp_url, headers=session, json=_rpc("notifications/initialized", {}, None))
        call = _rpc("tools/call", arguments, 2)
        # 2026-07-28: the version, the client's description and capabilities travel in every request.
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        single = _rpc("tools/call", {**arguments, "_meta": meta}, 3)
        exchange = {
            **headers,
            "mcp-protocol-version": MODERN,
            "mcp-method": "tools/call",
            "mcp-name": "get_order",
        }

        def answered(answer: httpx.Response) -> None:
            if answer.status_code != 200 or '"isError":true' in answer.text or '"error"' in answer.text:
                raise RuntimeError(f"tools/call failed: {answer.status_code} {answer.text[:200]}")

        bearer = {"authorization": headers["authorization"]}
        paths = {
            "direct": lambda: direct.get(direct_url).raise_for_status(),
            "gateway_open": lambda: gateway.get(open_url).raise_for_status(),
            "gateway_envelope": lambda: gateway.get(envelope_url, headers=bearer).raise_for_status(),
            "session": lambda: answered(gateway.post(mcp_url, headers=session, json=call)),
            "single_exchange": lambda: answered(gateway.post(mcp_url, headers=exchange, json=single)),
        }
        for _ in range(block):  # warm-up: connections, caches, the module's first calls
            for send in paths.values():
                send()
        times: dict[str, list[float]] = {name: [] for name in paths}
        services = {
            "mcp": estate.mcp.pid,
            "authz": estate.site.authz.pid if estate.site.authz else None,
            "envoy": estate.envoy.pid,
        }
        # CPU seconds each process spent during each path's blocks.
        cpu_s: dict[str, dict[str, float]] = {path: dict.fromkeys(services, 0.0) for path in paths}
        while len(times["direct"]) < calls:
            for name, send in paths.items():
                before = {service: _cpu_s(pid) for service, pid in services.items()}
                times[name] += [_timed(send) for _ in range(block)]
                for service, pid in services.items():
                    cpu_s[name][service] += _cpu_s(pid) - before[service]
        cpu_ms = {
            path: {service: round(spent * 1000 / len(times[path]), 3) for service, spent in spent_by.items()}
            for path, spent_by in cpu_s.items()
            if path != "direct"
        }
    direct_ms = _ms(times["direct"])
    p50 = {name: percentile(values, 50) for name, values in times.items()}
    result: dict[str, Any] = {"calls": len(times["direct"]), "direct_ms": direct_ms}
    for name in ("gateway_open", "gateway_envelope"):
        result[name] = {"ms": _ms(times[name]), "added_p50_ms": round(p50[name] - p50["direct"], 3)}
    for name in ("session", "single_exchange"):
        ms = _ms(times[name])
        result[name] = {
            "tools_call_ms": ms,
            "added_p50_ms": round(ms["p50"] - direct_ms["p50"], 3),
            "added_p99_ms": round(ms["p99"] - direct_ms["p99"], 3),
            "ratio_p50": round(ms["p50"] / direct_ms["p50"], 2),
        }
    mcp_p50 = min(p50["session"], p50["single_exchange"])
    result.update(
        {
            # What each layer adds at p50, from the paths of the same run (the cheaper kind of call).
            "layers_p50_ms": {
                "envoy": round(p50["gateway_open"] - p50["direct"], 3),
                "jwt_authn_and_check_with_envelope": round(p50["gateway_envelope"] - p50["gateway_open"], 3),
                "mcp_module_and_its_api_call": round(mcp_p50 - p50["gateway_envelope"], 3),
            },
            "cpu_ms_per_call": cpu_ms,
            "bound_p50_ms": BOUND_MS,
            "met": all(result[n]["added_p50_ms"] <= BOUND_MS for n in ("session", "single_exchange")),
            "load_average": {"start": load_at_start, "end": round(os.getloadavg()[0], 2)},
            "path": "client → Envoy → stoa-authz (Check, envelope) → stoa-mcp (envelope, grant) → echo API",
        }
    )
    return result


def run(calls: int) -> dict[str, Any]:
    with (
        # Removed after every process of the estate has stopped (the last context to exit).
        tempfile.TemporaryDirectory(prefix="stoa-bench-mcp-") as run_dir,
        EmbeddedPostgres() as pg,
        DevIdentityProvider(alg="ES256", audience=AUDIENCE) as idp,
        Estate(
            EstateOptions(authz="service", mcp=True, authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE}),
            postgres=pg,
            run_dir=Path(run_dir),
        ) as estate,
    ):
        admin = estate.admin
        admin.create_tenant(TENANT)
        admin.add_issuer(TENANT, idp.issuer, jwks=idp.jwks())
        estate.create_api("bench-orders", tenant_id=TENANT)
        estate.create_api("bench-open", tenant_id=TENANT, path_prefix=OPEN_PREFIX, auth={"mode": "none"})
        envelope = {"mode": "jwt", "scopes": [], "envelope": True}  # create_mcp_api's auth
        estate.create_api("bench-envelope", tenant_id=TENANT, path_prefix=ENVELOPE_PREFIX, auth=envelope)
        admin.create_mcp_api("bench-mcp", tenant_id=TENANT, path_prefix=PREFIX)
        schema = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
        admin.create_tool(
            "get_order", tenant_id=TENANT, description="Read an order", input_schema=schema,
            api_id="bench-orders", method="GET", path_template="/orders/{id}",
        )  # fmt: skip
        admin.grant_tool("bench", "get_order", tenant_id=TENANT, scopes=["bench"])
        for api_id in ("bench-open", "bench-envelope"):
            admin.deploy(api_id)
        admin.wait_synced(admin.deploy("bench-mcp"))
        ready = f"{estate.mcp_http_url}/health/ready"
        wait_until(lambda: httpx.get(ready, timeout=2).status_code == 200, 30, "the MCP module ready")
        return measure(estate, idp.mint(tenant=TENANT, scope="bench", sub="bench", lifetime_s=3600), calls)


def main() -> int:
    quick = os.environ.get("BENCH_QUICK") == "1"
    result = {**run(calls=300 if quick else 2000), "environment": environment(REPO)}
    out_dir = Path(
        os.environ.get("BENCH_RESULTS_DIR") or REPO / "bench" / "results" / datetime.date.today().isoformat()
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mcp.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
