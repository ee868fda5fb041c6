"""A `tools/call` through Envoy + the authorization service + the MCP module against a direct call of
the backing API, same run, one connection each, interleaved in blocks (so both see the same machine):
p50 and p99 of each, and what the MCP path adds at p50 (issue 16: ≤ 2 ms).

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

from stoa_harness.bench.report import percentile
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-bench-mcp"
TENANT = "bench"
PREFIX = "/mcp/bench"
PROTOCOL = "2025-11-25"
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


def measure(estate: Estate, token: str, calls: int, block: int = 50) -> dict[str, Any]:
    headers = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
    }
    mcp_url, direct_url = estate.url(PREFIX), f"{estate.upstream.url}/orders/1"
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
        headers["mcp-session-id"] = opened.headers["mcp-session-id"]
        headers["mcp-protocol-version"] = PROTOCOL
        gateway.post(mcp_url, headers=headers, json=_rpc("notifications/initialized", {}, None))
        call = _rpc("tools/call", {"name": "get_order", "arguments": {"id": "1"}}, 2)

        def through_mcp() -> None:
            answer = gateway.post(mcp_url, headers=headers, json=call)
            if answer.status_code != 200 or '"isError":true' in answer.text:
                raise RuntimeError(f"tools/call failed: {answer.status_code} {answer.text[:200]}")

        def straight() -> None:
            direct.get(direct_url).raise_for_status()

        for _ in range(block):  # warm-up: connections, caches, the module's first calls
            through_mcp()
            straight()
        mcp_ms: list[float] = []
        direct_ms: list[float] = []
        while len(mcp_ms) < calls:
            mcp_ms += [_timed(through_mcp) for _ in range(block)]
            direct_ms += [_timed(straight) for _ in range(block)]
    mcp_p50, direct_p50 = percentile(mcp_ms, 50), percentile(direct_ms, 50)
    return {
        "calls": len(mcp_ms),
        "tools_call_ms": {"p50": round(mcp_p50, 3), "p99": round(percentile(mcp_ms, 99), 3)},
        "direct_ms": {"p50": round(direct_p50, 3), "p99": round(percentile(direct_ms, 99), 3)},
        "added_p50_ms": round(mcp_p50 - direct_p50, 3),
        "added_p99_ms": round(percentile(mcp_ms, 99) - percentile(direct_ms, 99), 3),
        "bound_p50_ms": BOUND_MS,
        "met": mcp_p50 - direct_p50 <= BOUND_MS,
        "path": "client → Envoy → stoa-authz (Check, envelope) → stoa-mcp (envelope, grant) → echo API",
    }


def run(calls: int) -> dict[str, Any]:
    with (
        EmbeddedPostgres() as pg,
        DevIdentityProvider(alg="ES256", audience=AUDIENCE) as idp,
        Estate(
            EstateOptions(authz="service", mcp=True, authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE}),
            postgres=pg,
            run_dir=Path(tempfile.mkdtemp(prefix="stoa-bench-mcp-")),
        ) as estate,
    ):
        admin = estate.admin
        admin.create_tenant(TENANT)
        admin.add_issuer(TENANT, idp.issuer, jwks=idp.jwks())
        estate.create_api("bench-orders", tenant_id=TENANT)
        admin.create_mcp_api("bench-mcp", tenant_id=TENANT, path_prefix=PREFIX)
        schema = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
        admin.create_tool(
            "get_order", tenant_id=TENANT, description="Read an order", input_schema=schema,
            api_id="bench-orders", method="GET", path_template="/orders/{id}",
        )  # fmt: skip
        admin.grant_tool("bench", "get_order", tenant_id=TENANT, scopes=["bench"])
        admin.wait_synced(admin.deploy("bench-mcp"))
        ready = f"{estate.mcp_http_url}/health/ready"
        wait_until(lambda: httpx.get(ready, timeout=2).status_code == 200, 30, "the MCP module ready")
        return measure(estate, idp.mint(tenant=TENANT, scope="bench", sub="bench", lifetime_s=3600), calls)


def main() -> int:
    quick = os.environ.get("BENCH_QUICK") == "1"
    result = run(calls=300 if quick else 2000)
    out_dir = Path(
        os.environ.get("BENCH_RESULTS_DIR") or REPO / "bench" / "results" / datetime.date.today().isoformat()
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mcp.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
