"""The Link's readiness, as its operator endpoint (`stoa_ops.endpoint`) answers `/health/ready`.

Ready = a snapshot has been acknowledged by every required client (Envoy, and stoa-authz when
AUTHZ_SAN is set): `AdsServer.publish` only records a snapshot as acknowledged once all of them
ACKed it.
"""

from __future__ import annotations

from collections.abc import Callable

from stoa_translate.snapshot import ROUTE, SCOPED_ROUTE, Snapshot

from stoa_link.ads import AdsServer


def routing(snapshot: Snapshot, unkeyed: tuple[str, ...]) -> dict[str, object]:
    """How the acknowledged snapshot routes: by scope (Scoped RDS: how many scopes and route tables),
    or through one route table, with the routes whose prefix kept it there when scopes were asked for."""
    scopes = snapshot.of(SCOPED_ROUTE)
    if scopes:
        tables = len(snapshot.of(ROUTE)) - len(snapshot.on_request)  # not the one kept for older listeners
        return {"routing": "scoped", "scopes": len(scopes), "route_tables": tables}
    return {"routing": "one table", **({"unkeyed_routes": list(unkeyed)} if unkeyed else {})}


def readiness(
    ads: AdsServer, unkeyed: Callable[[], tuple[str, ...]] = tuple
) -> tuple[str | None, dict[str, object]]:
    """None when ready, else why not; with the clients seen (and, once ready, what they hold and how
    it routes; `unkeyed`: the routes the last translation could not key)."""
    clients = {identity: ads.connected(identity) for identity in ads.identities}
    acked = ads.acked_snapshot
    if acked is not None:
        held = {"generation": acked.generation, "version": acked.version, "clients": clients}
        return None, {**held, **routing(acked, unkeyed())}
    missing = [identity for identity, n in clients.items() if not n]
    reason = (
        f"waiting for ADS clients: {', '.join(missing)}"
        if missing
        else "no snapshot acknowledged by every required client yet"
    )
    return reason, {"clients": clients}
