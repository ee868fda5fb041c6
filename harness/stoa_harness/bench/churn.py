"""Churn: rounds of add / modify / reorder / switch-backend on 100 routes while wrk hits every one
of them continuously; every non-2xx answer (and every socket error) counts against the gateway.

Per round, each through the CP API, then the round waits for SYNCED:
- add: a new API deployed;
- modify: 5 routes get a new timeout;
- reorder: a new API whose prefix nests inside a hit route (`/apis/churn-007/r3`), which must sort
  before its parent, so every later route moves in the table;
- switch-backend: 5 routes move to the next backend (A → B → C → A): backend C is used by a few
  routes only, so its cluster appears and disappears as they come and go.
"""

from __future__ import annotations

from typing import Any

from stoa_harness.bench.load import WrkRun
from stoa_harness.bench.rig import TENANT, Rig
from stoa_harness.wait import wait_until

ROUTES = 100
BACKENDS = ("a", "b", "c")
PER_ROUND = 5


def run(rig: Rig, *, rounds: int = 20, connections: int = 8) -> dict[str, Any]:
    estate = rig.estate
    ids = [f"churn-{i:03d}" for i in range(ROUTES)]
    backend = {a: BACKENDS[i % 2] for i, a in enumerate(ids)}  # A and B; C only through switches
    timeout = dict.fromkeys(ids, 15_000)
    rig.seed(ids)
    for a in ids:
        if backend[a] != "a":
            estate.admin.update_api(a, rig.api_body(a, backend[a]), tenant_id=TENANT)
    estate.admin.wait_synced(timeout=60)
    paths = [f"/apis/{a}/x" for a in ids]
    wait_until(lambda: all(rig.answers(p) for p in paths), 30, "every churn route serving")

    def put(a: str) -> None:
        body = rig.api_body(a, backend[a], timeout_ms=timeout[a])
        estate.admin.update_api(a, body, tenant_id=TENANT)

    with WrkRun(rig.gateway_url, paths=paths, connections=connections, duration_s=600) as load:
        for r in range(rounds):
            estate.publish(f"churn-add-{r:02d}", tenant_id=TENANT, **_fields(rig, "a"))
            for k in range(PER_ROUND):
                a = ids[(r * 2 * PER_ROUND + k) % ROUTES]
                timeout[a] = 1_000 + r
                put(a)
            parent = ids[(r * 7) % ROUTES]
            estate.publish(
                f"churn-nest-{r:02d}",
                tenant_id=TENANT,
                path_prefix=f"/apis/{parent}/r{r}",
                **_fields(rig, "a"),
            )
            for k in range(PER_ROUND):
                a = ids[(r * 2 * PER_ROUND + PER_ROUND + k) % ROUTES]
                backend[a] = BACKENDS[(BACKENDS.index(backend[a]) + 1) % len(BACKENDS)]
                put(a)
            estate.admin.wait_synced(timeout=60)
        load.interrupt()
        result = load.result()
    return {
        "rounds": rounds,
        "routes": ROUTES,
        "connections": connections,
        "requests": result.requests,
        "non_2xx": result.non_2xx,
        "socket_errors": result.socket_errors,
        "rps": result.rps,
        "p99_ms": result.p99_ms,
    }


def _fields(rig: Rig, backend: str) -> dict[str, Any]:
    body = rig.api_body("unused", backend)
    return {"upstream_url": body["upstream_url"], "auth": body["auth"]}
