"""Data path: the same Envoy and the same upstream, with and without the authorization hop.

Variants, each repetition measured back to back with its own proxy-only baseline:
- `proxy_only`: the bench listener in the estate Envoy (router only) → fast upstream A;
- `authz_cached`: the Link's listener, a JWT route (full decision: signature, audience, tenant,
  scope), the same token every request (the service's token cache hits);
- `authz_uncached`: the same route, tokens rotating through more distinct tokens than the service
  caches (every decision verifies a signature);
each with 1, 2 and 4 `stoa-authz` worker processes (STOA_AUTHZ_WORKERS, SO_REUSEPORT;
`BENCH_AUTHZ_WORKERS=1,2` narrows the list, which must include 1). These run with the Link's
`STOA_LINK_DECISION_PLACEMENT=service`, so the route goes through the service. Then, same run:
- `noop_check`: the same route through a Check server that decides nothing (`noop_check`, the same
  grpcio server as the service): `authz_floor_ratio` = the service's ratio ÷ this one;
- `native_cached`, `native_uncached`: the Link back to `auto`, the route decided by Envoy's own
  filters (jwt_authn, rbac), no Check, with the same tokens as above (uncached: more distinct tokens
  than Envoy's JWT cache holds per worker).
Authz CPU per decision = CPU time of every process in the authz session ÷ Checks Envoy made.
Each phase also records `cpu_split`: the cores used by the gateway Envoy, the upstream Envoy, the
authz processes and wrk during the phase (from /proc and the reaped wrk's rusage), the evidence of
what shares the machine.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from typing import Any

from stoa_harness.bench.load import WrkResult, run_wrk
from stoa_harness.bench.report import spread
from stoa_harness.bench.rig import Rig, cpu_seconds, session_pids
from stoa_harness.ports import free_port
from stoa_harness.processes import SupervisedProcess, tcp_accepting
from stoa_harness.wait import wait_until

API_ID = "bench-dp"
PATH = f"/apis/{API_ID}/resource"
WORKER_COUNTS = tuple(int(n) for n in os.environ.get("BENCH_AUTHZ_WORKERS", "1,2,4").split(","))
CONNECTIONS = 32
UNCACHED_TOKENS = 12_000  # above the service's default token cache (10,000 entries)
# Requests jwt_authn let through on the gateway's listener (its HTTP connection manager's stats).
JWT_ALLOWED = r"^http\.stoa\.jwt_authn\.allowed$"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _split(
    rig: Rig, load: Callable[[], WrkResult], checker: int | None = None
) -> tuple[WrkResult, dict[str, float], float]:
    """Run `load`; its result, the cores each party used meanwhile, and the CPU seconds of the Check
    server (stoa-authz's session, or the process `checker`)."""
    gateway, upstream = rig.estate.envoy.proc, rig.upstream.envoy.proc
    if gateway is None or upstream is None:
        raise RuntimeError("both Envoys must run during the data path")
    groups = {
        "gateway_envoy": [gateway.pid],
        "upstream_envoy": [upstream.pid],
        "authz": [checker] if checker is not None else session_pids(rig.authz_leader),
    }
    before = {name: cpu_seconds(pids) for name, pids in groups.items()}
    wrk0 = _children_cpu()
    result = load()
    wrk1 = _children_cpu()
    after = {name: cpu_seconds(pids) for name, pids in groups.items()}
    wall = after["authz"].at - before["authz"].at
    split = {name: (after[name].seconds - before[name].seconds) / wall for name in groups}
    split["wrk"] = (wrk1 - wrk0) / wall  # wrk is this process's only child reaped meanwhile
    return result, split, after["authz"].seconds - before["authz"].seconds


def authz_phase(
    rig: Rig,
    tokens: list[str],
    connections: int,
    duration_s: float,
    checker: int | None = None,
    *,
    path: str = PATH,
    credential_header: str = "authorization",
) -> dict[str, Any]:
    """wrk on a route of the Link's listener; with the Checks it made and the authz CPU per Check."""
    checks0 = rig.ext_authz_checks()
    result, split, authz_cpu = _split(
        rig,
        lambda: run_wrk(
            rig.gateway_url,
            paths=[path],
            tokens=tokens,
            credential_header=credential_header,
            connections=connections,
            duration_s=duration_s,
        ),
        checker,
    )
    checks1 = rig.ext_authz_checks()
    checks = max(1, checks1 - checks0)
    return {
        **result.as_dict(),
        "checks": checks1 - checks0,
        "authz_cpu_us_per_decision": authz_cpu / checks * 1e6,
        "authz_cpu_cores": split["authz"],
        "cpu_split": split,
    }


def _proxy_phase(rig: Rig, tokens: list[str], connections: int, duration_s: float) -> dict[str, Any]:
    result, split, _ = _split(
        rig,
        lambda: run_wrk(
            rig.proxy_only_url, paths=[PATH], tokens=tokens, connections=connections, duration_s=duration_s
        ),
    )
    return {**result.as_dict(), "cpu_split": split}


def check_clean(name: str, phase: dict[str, Any]) -> None:
    if phase["non_2xx"] or phase["socket_errors"]:
        raise AssertionError(
            f"{name}: {phase['non_2xx']} non-2xx, {phase['socket_errors']} socket errors"
            " — the figure would not measure successful requests"
        )


def _native_phase(rig: Rig, tokens: list[str], connections: int, duration_s: float) -> dict[str, Any]:
    """The JWT route on the gateway's listener, decided by Envoy: every request it served passed
    jwt_authn, and none was Checked."""
    checks0, verified0 = rig.ext_authz_checks(), rig.estate.envoy.counters(JWT_ALLOWED)
    result, split, _ = _split(
        rig,
        lambda: run_wrk(
            rig.gateway_url, paths=[PATH], tokens=tokens, connections=connections, duration_s=duration_s
        ),
    )
    verified = rig.estate.envoy.counters(JWT_ALLOWED) - verified0
    if rig.ext_authz_checks() != checks0:
        raise AssertionError("the native route made Checks: it is not decided by Envoy")
    if verified < result.requests:
        raise AssertionError(
            f"jwt_authn verified {verified} of {result.requests} requests: not the native route"
        )
    return {**result.as_dict(), "cpu_split": split}


def _one_conn_added(
    rig: Rig,
    tokens: list[str],
    duration_s: float,
    name: str,
    phase: Callable[[Rig, list[str], int, float], dict[str, Any]],
) -> dict[str, float]:
    """p50 at one connection, proxy-only and through `phase`, and what `phase` adds to it."""
    base = _proxy_phase(rig, tokens, 1, duration_s)
    hop = phase(rig, tokens, 1, duration_s)
    return {
        "proxy_p50_ms": base["p50_ms"],
        f"{name}_p50_ms": hop["p50_ms"],
        "added_p50_ms": hop["p50_ms"] - base["p50_ms"],
    }


def _beside_the_service(
    rig: Rig, cached: list[str], uncached: list[str], *, reps: int, duration_s: float, one_conn_s: float
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The no-op Check server, then Envoy deciding natively; each repetition with its own baseline."""
    variants: dict[str, list[dict[str, Any]]] = {}
    address = f"127.0.0.1:{free_port()}"
    host, port = address.split(":")
    noop = SupervisedProcess(
        "noop-check",
        [sys.executable, "-m", "stoa_harness.bench.noop_check", address],
        log_dir=rig.run_dir,
        ready=lambda: tcp_accepting(host, int(port)),
    )
    service_address = rig.estate.link.env["STOA_LINK_EXT_AUTHZ_ADDRESS"]
    with noop:
        rig.relink(EXT_AUTHZ_ADDRESS=address)
        for _ in range(reps):
            proxy = _proxy_phase(rig, cached, CONNECTIONS, duration_s)
            phase = authz_phase(rig, cached, CONNECTIONS, duration_s, checker=noop.pid)
            check_clean("noop_check", phase)
            phase["ratio"] = phase["rps"] / proxy["rps"]
            variants.setdefault("noop_check", []).append(phase)
        rig.relink(EXT_AUTHZ_ADDRESS=service_address, DECISION_PLACEMENT="auto")
    one_conn = []
    for _ in range(reps):
        proxy = _proxy_phase(rig, cached, CONNECTIONS, duration_s)
        variants.setdefault("proxy_only_native", []).append(proxy)
        for name, tokens in (("native_cached", cached), ("native_uncached", uncached)):
            phase = _native_phase(rig, tokens, CONNECTIONS, duration_s)
            check_clean(name, phase)
            phase["ratio"] = phase["rps"] / proxy["rps"]
            variants.setdefault(name, []).append(phase)
        one_conn.append(_one_conn_added(rig, cached, one_conn_s, "native", _native_phase))
    return variants, one_conn


def run(rig: Rig, *, reps: int, duration_s: float, one_conn_duration_s: float) -> dict[str, Any]:
    estate = rig.estate
    estate.admin.create_api(tenant_id="demo", **rig.api_body(API_ID, jwt=True))
    estate.admin.wait_synced(estate.admin.deploy(API_ID))
    rig.relink(DECISION_PLACEMENT="service")
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
            proxy = _proxy_phase(rig, cached, CONNECTIONS, duration_s)
            check_clean("proxy_only", proxy)
            variants.setdefault("proxy_only", []).append(proxy)
            for name, tokens in (("authz_cached", cached), ("authz_uncached", uncached)):
                phase = authz_phase(rig, tokens, CONNECTIONS, duration_s)
                check_clean(name, phase)
                phase["ratio"] = phase["rps"] / proxy["rps"]
                variants.setdefault(f"{name}_w{workers}", []).append(phase)
        if workers == 1:
            for _ in range(reps):
                one_conn.append(_one_conn_added(rig, cached, one_conn_duration_s, "authz", authz_phase))
    rig.restart_authz(1)
    wait_until(serving, 30, "JWT route served with 1 authz worker")
    beside, native_one_conn = _beside_the_service(
        rig, cached, uncached, reps=reps, duration_s=duration_s, one_conn_s=one_conn_duration_s
    )
    variants.update(beside)

    summary = {
        name: {
            key: spread([p[key] for p in phases])
            for key in ("rps", "p50_ms", "p90_ms", "p99_ms", "ratio", "authz_cpu_us_per_decision")
            if key in phases[0]
        }
        | {"cpu_split": {k: spread([p["cpu_split"][k] for p in phases]) for k in phases[0]["cpu_split"]}}
        for name, phases in variants.items()
    }
    ratios = {name: s["ratio"]["median"] for name, s in summary.items() if "ratio" in s}
    best = max((n for n in ratios if n.startswith("authz_cached")), key=ratios.__getitem__)
    added = spread([r["added_p50_ms"] for r in one_conn])
    native_added = spread([r["added_p50_ms"] for r in native_one_conn])
    cpu = summary["authz_cached_w1"]["authz_cpu_us_per_decision"]
    return {
        "native_ratio": ratios["native_cached"],
        "native_ratio_spread": summary["native_cached"]["ratio"],
        "native_uncached_ratio": ratios["native_uncached"],
        "native_uncached_ratio_spread": summary["native_uncached"]["ratio"],
        # Each figure against its own proxy-only baseline of the same repetition, so a machine
        # slowing down between the two sets of phases does not count as the service's cost.
        "authz_floor_ratio": ratios["authz_cached_w1"] / ratios["noop_check"],
        "noop_check_ratio": ratios["noop_check"],
        "native_added_p50_ms_one_conn": native_added["median"],
        "native_added_p50_ms_one_conn_spread": native_added,
        "native_one_connection": native_one_conn,
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
