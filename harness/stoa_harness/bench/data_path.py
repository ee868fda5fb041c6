"""Data path: the same Envoy and the same upstream, with and without the authorization hop.

Variants, each repetition measured back to back with its own proxy-only baseline:
- `proxy_only`: the bench listener in the estate Envoy (router only) → fast upstream A;
- `authz_cached`: the Link's listener, a JWT route (full decision: signature, audience, tenant,
  scope), the same token every request (the service's token cache hits);
- `authz_uncached`: the same route, tokens rotating through more distinct tokens than the service
  caches (every decision verifies a signature);
each with 1, 2 and 4 `stoa-authz` worker processes (STOA_AUTHZ_WORKERS, SO_REUSEPORT).
Authz CPU per decision = CPU time of every process in the authz session ÷ Checks Envoy made.
"""

from __future__ import annotations

from typing import Any

from stoa_harness.bench.load import WrkResult, run_wrk
from stoa_harness.bench.report import spread
from stoa_harness.bench.rig import Rig, cpu_seconds, session_pids
from stoa_harness.estate import checked
from stoa_harness.wait import wait_until

API_ID = "bench-dp"
PATH = f"/apis/{API_ID}/resource"
WORKER_COUNTS = (1, 2, 4)
CONNECTIONS = 32
UNCACHED_TOKENS = 12_000  # above the service's default token cache (10,000 entries)


def _authz_phase(rig: Rig, tokens: list[str], connections: int, duration_s: float) -> dict[str, Any]:
    pids = session_pids(rig.authz_leader)
    cpu0, checks0 = cpu_seconds(pids), rig.ext_authz_checks()
    result = run_wrk(
        rig.gateway_url, paths=[PATH], tokens=tokens, connections=connections, duration_s=duration_s
    )
    cpu1, checks1 = cpu_seconds(pids), rig.ext_authz_checks()
    checks = max(1, checks1 - checks0)
    return {
        **result.as_dict(),
        "checks": checks1 - checks0,
        "authz_cpu_us_per_decision": (cpu1.seconds - cpu0.seconds) / checks * 1e6,
        "authz_cpu_cores": (cpu1.seconds - cpu0.seconds) / (cpu1.at - cpu0.at),
    }


def _proxy_phase(rig: Rig, tokens: list[str], connections: int, duration_s: float) -> WrkResult:
    return run_wrk(
        rig.proxy_only_url, paths=[PATH], tokens=tokens, connections=connections, duration_s=duration_s
    )


def _check_clean(name: str, phase: dict[str, Any]) -> None:
    if phase["non_2xx"] or phase["socket_errors"]:
        raise AssertionError(
            f"{name}: {phase['non_2xx']} non-2xx, {phase['socket_errors']} socket errors"
            " — the figure would not measure successful requests"
        )


def run(rig: Rig, *, reps: int, duration_s: float, one_conn_duration_s: float) -> dict[str, Any]:
    estate = rig.estate
    checked(estate.admin.post("/v1/tenants/demo/apis", json=rig.api_body(API_ID, jwt=True)))
    estate.wait_synced(estate.deploy(API_ID))
    cached = rig.mint_tokens(1)
    uncached = rig.mint_tokens(UNCACHED_TOKENS)
    headers = {"authorization": f"Bearer {cached[0]}"}

    def serving() -> bool:
        return estate.gateway.get(estate.url(PATH), headers=headers).status_code == 200

    variants: dict[str, list[dict[str, Any]]] = {}
    one_conn: list[dict[str, Any]] = []
    for workers in WORKER_COUNTS:
        rig.restart_authz(workers)
        wait_until(serving, 30, f"JWT route served with {workers} authz worker(s)")
        run_wrk(
            rig.gateway_url, paths=[PATH], tokens=cached, connections=CONNECTIONS, duration_s=1
        )  # warm-up
        for _ in range(reps):
            proxy = _proxy_phase(rig, cached, CONNECTIONS, duration_s).as_dict()
            _check_clean("proxy_only", proxy)
            variants.setdefault("proxy_only", []).append(proxy)
            for name, tokens in (("authz_cached", cached), ("authz_uncached", uncached)):
                phase = _authz_phase(rig, tokens, CONNECTIONS, duration_s)
                _check_clean(name, phase)
                phase["ratio"] = phase["rps"] / proxy["rps"]
                variants.setdefault(f"{name}_w{workers}", []).append(phase)
        if workers == 1:
            for _ in range(reps):
                base = _proxy_phase(rig, cached, 1, one_conn_duration_s)
                hop = _authz_phase(rig, cached, 1, one_conn_duration_s)
                one_conn.append(
                    {
                        "proxy_p50_ms": base.p50_ms,
                        "authz_p50_ms": hop["p50_ms"],
                        "added_p50_ms": hop["p50_ms"] - base.p50_ms,
                    }
                )
    rig.restart_authz(1)
    wait_until(serving, 30, "JWT route served with 1 authz worker")

    summary = {
        name: {
            key: spread([p[key] for p in phases])
            for key in ("rps", "p50_ms", "p90_ms", "p99_ms", "ratio", "authz_cpu_us_per_decision")
            if key in phases[0]
        }
        for name, phases in variants.items()
    }
    ratios = {name: s["ratio"]["median"] for name, s in summary.items() if "ratio" in s}
    best = max((n for n in ratios if n.startswith("authz_cached")), key=ratios.__getitem__)
    added = spread([r["added_p50_ms"] for r in one_conn])
    cpu = summary["authz_cached_w1"]["authz_cpu_us_per_decision"]
    return {
        "authz_ratio": ratios[best],
        "authz_ratio_variant": best,
        "authz_ratio_spread": summary[best]["ratio"],
        "added_p50_ms_one_conn": added["median"],
        "added_p50_ms_one_conn_spread": added,
        "authz_cpu_us_per_decision": cpu["median"],
        "authz_cpu_us_per_decision_spread": cpu,
        "authz_cpu_us_per_decision_uncached": summary["authz_uncached_w1"]["authz_cpu_us_per_decision"][
            "median"
        ],
        "connections": CONNECTIONS,
        "duration_s": duration_s,
        "repetitions": reps,
        "variants": summary,
        "one_connection": one_conn,
        "raw": variants,
    }
