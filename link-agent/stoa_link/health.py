"""The Link's readiness, as its operator endpoint (`stoa_ops.endpoint`) answers `/health/ready`.

Ready = a snapshot has been acknowledged by every required client (Envoy, and stoa-authz when
AUTHZ_SAN is set): `AdsServer.publish` only records a snapshot as acknowledged once all of them
ACKed it.
"""

from __future__ import annotations

from stoa_link.ads import AdsServer


def readiness(ads: AdsServer) -> tuple[str | None, dict[str, object]]:
    """None when ready, else why not; with the clients seen (and, once ready, what they hold)."""
    clients = {identity: ads.connected(identity) for identity in ads.identities}
    acked = ads.acked_snapshot
    if acked is not None:
        return None, {"generation": acked.generation, "version": acked.version, "clients": clients}
    missing = [identity for identity, n in clients.items() if not n]
    reason = (
        f"waiting for ADS clients: {', '.join(missing)}"
        if missing
        else "no snapshot acknowledged by every required client yet"
    )
    return reason, {"clients": clients}
