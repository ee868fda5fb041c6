"""Consumers on the data path (issue 13): the routes an API-selling platform adds, each against the
plain JWT route of the same run (its throughput ratio to it, repetition by repetition).

All four are decided by the authorization service (the Link's STOA_LINK_DECISION_PLACEMENT=service),
so each ratio prices the feature, not leaving Envoy's own filters (the plain JWT route decided by
Envoy is `data_path.native_ratio`):
- `jwt`: the plain JWT route, one token (the service's decision cache hits): the denominator;
- `key`: an API-key route (the key's digest looked up, its consumer's subscription, the plan's
  non-billed quota counted in process and flushed in batches);
- `billed`: a JWT route whose token's consumer needs a subscription, under a billed plan (one
  atomic PostgreSQL statement per request, all on one counter row);
- `opa`: the API-key route with an OPA policy (Rego evaluated in process by regorus).
Also:
- `billed_added_p50_ms_one_conn`: the billed route's p50 less the plain JWT route's, one connection;
- `opa_cpu_us_per_decision`: the CPU time (thread time, in this process) of building the neutral
  input and evaluating the bench's module on it, the OPA phase's own cost; the end-to-end difference
  in authz CPU per Check between the `opa` and `key` phases is reported beside it;
- `revocation_propagation_ms`: a live key's DELETE sent to the CP → its first 401 through Envoy.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from stoa_authz.opa import RegoPolicy, identity_input, neutral_input

from stoa_harness.bench.data_path import authz_phase, check_clean
from stoa_harness.bench.report import spread
from stoa_harness.bench.rig import SCOPE, TENANT, Rig
from stoa_harness.wait import wait_until

CONNECTIONS = 32
CONSUMER = "bench-consumer"
CLIENT_ID = "bench-app"
KEY_HEADER = "x-api-key"
# Plans no bench run can exhaust: the phases measure counting, never a 429.
LIMIT = 1_000_000_000
WINDOW_S = 86_400
REVOCATIONS = 5
OPA_EVALUATIONS = 5_000
ROUTES = {
    "jwt": {"mode": "jwt", "scopes": [SCOPE]},
    "key": {"mode": "api_key"},
    "billed": {"mode": "jwt", "scopes": [SCOPE], "subscription": True},
    "opa": {"mode": "api_key"},
}
PLANS = {"jwt": None, "key": "bench-free", "billed": "bench-billed", "opa": "bench-free"}
# A small policy of the documented kind: the method, the path's segments, the consumer, a header.
MODULE = """package stoa

default allow := false

allow if {
    input.method == "GET"
    input.path_segments[0] == "apis"
    input.identity.consumer == "bench-consumer"
    not input.headers["x-blocked"]
}
"""


def path(name: str) -> str:
    return f"/apis/bench-{name}/resource"


def _seed(rig: Rig) -> tuple[str, str]:
    """The four routes, the consumer (its client id and a key), plans and subscriptions; (token, key)."""
    admin = rig.estate.admin
    admin.create_plan("bench-free", tenant_id=TENANT, requests=LIMIT, window_seconds=WINDOW_S)
    admin.create_plan("bench-billed", tenant_id=TENANT, requests=LIMIT, window_seconds=WINDOW_S, billed=True)
    admin.create_consumer(CONSUMER, tenant_id=TENANT, client_ids=[CLIENT_ID])
    for name, auth in ROUTES.items():
        api_id = f"bench-{name}"
        admin.create_api(tenant_id=TENANT, **rig.api_body(api_id, auth=auth))
        admin.deploy(api_id)
        plan = PLANS[name]
        if plan is not None:
            admin.subscribe(
                f"bench-{name}", tenant_id=TENANT, consumer_id=CONSUMER, api_id=api_id, plan_id=plan
            )
    admin.create_policy("bench-opa", "opa", {"module": MODULE}, tenant_id=TENANT, targets=["bench-opa"])
    key = str(admin.create_key(CONSUMER, tenant_id=TENANT)["key"])
    admin.wait_synced()
    token = rig.idp.mint(tenant=TENANT, scope=SCOPE, sub="bench-0", azp=CLIENT_ID, lifetime_s=3600)
    return token, key


def _credentials(name: str, token: str, key: str) -> tuple[list[str], str]:
    return ([key], KEY_HEADER) if ROUTES[name]["mode"] == "api_key" else ([token], "authorization")


def _answers(rig: Rig, name: str, token: str, key: str) -> bool:
    [credential], header = _credentials(name, token, key)
    value = credential if header == KEY_HEADER else f"Bearer {credential}"
    return rig.estate.gateway.get(rig.estate.url(path(name)), headers={header: value}).status_code == 200


def opa_cpu_us(key: str) -> float:
    """Thread CPU µs per OPA decision: the neutral input built from a request's headers, then evaluated."""
    policy = RegoPolicy("bench-opa", MODULE, "data.stoa.allow")
    headers = {
        ":authority": "127.0.0.1",
        ":path": path("opa"),
        "host": "127.0.0.1",
        "user-agent": "wrk",
        "accept": "*/*",
        "x-request-id": "4f9c2a3e-1b7d-4c55-9e0a-6f1d2b3c4d5e",
        KEY_HEADER: key,
    }
    identity = identity_input(TENANT, None, (), CONSUMER)

    def decide() -> bool:
        document = neutral_input("GET", path("opa"), headers, KEY_HEADER, ("bench-opa", TENANT), identity)
        return policy.allows(document)

    if not decide():
        raise AssertionError("the bench's OPA module denies the bench's request")
    started = time.thread_time()
    for _ in range(OPA_EVALUATIONS):
        decide()
    return (time.thread_time() - started) / OPA_EVALUATIONS * 1e6


def revocations(rig: Rig, samples: int) -> list[float]:
    """ms from sending a live key's DELETE to the CP to its first 401 through Envoy, `samples` times."""
    admin, gateway, url = rig.estate.admin, rig.estate.gateway, rig.estate.url(path("key"))
    out = []
    for _ in range(samples):
        created = admin.create_key(CONSUMER, tenant_id=TENANT)
        headers = {KEY_HEADER: str(created["key"])}
        wait_until(lambda h=headers: gateway.get(url, headers=h).status_code == 200, 10, "a new key served")
        started = time.perf_counter()
        admin.revoke_key(CONSUMER, str(created["key_id"]), tenant_id=TENANT)
        wait_until(
            lambda h=headers: gateway.get(url, headers=h).status_code == 401,
            10,
            "the revoked key refused",
            interval=0.002,
        )
        out.append((time.perf_counter() - started) * 1000)
    return out


def run(rig: Rig, *, reps: int, duration_s: float, one_conn_duration_s: float) -> dict[str, Any]:
    token, key = _seed(rig)
    rig.relink(DECISION_PLACEMENT="service")
    for name in ROUTES:
        wait_until(lambda n=name: _answers(rig, n, token, key), 30, f"the {name} route served")
        credentials, header = _credentials(name, token, key)
        authz_phase(rig, credentials, CONNECTIONS, 1, path=path(name), credential_header=header)  # warm-up
    phases: dict[str, list[dict[str, Any]]] = {}
    one_conn: list[dict[str, Any]] = []
    for _ in range(reps):
        # ROUTES starts with the plain JWT route: each later phase's ratio is to this repetition's.
        rep: dict[str, dict[str, Any]] = {}
        for name in ROUTES:
            credentials, header = _credentials(name, token, key)
            phase = authz_phase(
                rig, credentials, CONNECTIONS, duration_s, path=path(name), credential_header=header
            )
            check_clean(f"consumers.{name}", phase)
            rep[name] = phase
            phase["ratio_to_jwt"] = phase["rps"] / rep["jwt"]["rps"]
            phases.setdefault(name, []).append(phase)
        jwt = authz_phase(rig, [token], 1, one_conn_duration_s, path=path("jwt"))
        billed = authz_phase(rig, [token], 1, one_conn_duration_s, path=path("billed"))
        check_clean("consumers.jwt one connection", jwt)
        check_clean("consumers.billed one connection", billed)
        one_conn.append(
            {
                "jwt_p50_ms": jwt["p50_ms"],
                "billed_p50_ms": billed["p50_ms"],
                "added_p50_ms": billed["p50_ms"] - jwt["p50_ms"],
            }
        )
    rig.relink(DECISION_PLACEMENT="auto")
    propagation = revocations(rig, REVOCATIONS)
    opa_cpu = [opa_cpu_us(key) for _ in range(3)]

    summary = {
        name: {
            k: spread([p[k] for p in runs])
            for k in ("rps", "p50_ms", "p99_ms", "ratio_to_jwt", "authz_cpu_us_per_decision")
        }
        for name, runs in phases.items()
    }
    cpu = {name: s["authz_cpu_us_per_decision"]["median"] for name, s in summary.items()}
    added = spread([r["added_p50_ms"] for r in one_conn])
    return {
        "key_ratio": summary["key"]["ratio_to_jwt"]["median"],
        "billed_ratio": summary["billed"]["ratio_to_jwt"]["median"],
        "opa_ratio": summary["opa"]["ratio_to_jwt"]["median"],
        "billed_added_p50_ms_one_conn": added["median"],
        "billed_added_p50_ms_one_conn_spread": added,
        "opa_cpu_us_per_decision": statistics.median(opa_cpu),
        "opa_cpu_us_per_decision_samples": opa_cpu,
        "opa_added_authz_cpu_us_per_check": cpu["opa"] - cpu["key"],
        "revocation_propagation_ms": statistics.median(propagation),
        "revocation_propagation_ms_max": max(propagation),
        "revocation_propagation_samples_ms": propagation,
        "placement": "service",
        "connections": CONNECTIONS,
        "duration_s": duration_s,
        "repetitions": reps,
        "variants": summary,
        "one_connection": one_conn,
        "raw": phases,
    }
