"""The ACK deadline through a real Envoy and the real `stoa-authz` (CP + Link + Envoy + stoa-authz).

A missed ACK is reported FAILED (`ACK_TIMEOUT`) when the deadline passes, and only then is the last
acknowledged snapshot put back; a publication while Envoy or stoa-authz has no stream open is reported
FAILED naming the missing client when the deadline passes, and SYNCED once it connects and ACKs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import httpx
import pytest
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.wait import wait_until

DEADLINE_S = 4.0
ENVOY_SAN = "spiffe://stoa.local/envoy"
AUTHZ_SAN = "spiffe://stoa.local/ext-authz"
OPEN = {"mode": "none"}  # routes Envoy serves without a Check: what is asserted is the publication


@pytest.fixture(scope="module")
def estate(estates: Callable[..., Estate]) -> Estate:
    options = EstateOptions(
        authz="service",
        link_env={"STOA_LINK_ACK_TIMEOUT_S": str(DEADLINE_S)},
        authz_env={"STOA_AUTHZ_AUDIENCE": "stoa"},
    )
    running = estates(options, "deadline")
    running.admin.create_tenant("demo", exist_ok=True)
    return running


def link_clients(estate: Estate) -> dict[str, int]:
    """The ADS streams the Link counts per client identity, as its readiness reports them."""
    return httpx.get(f"{estate.link_http_url}/health/ready", timeout=5).json()["clients"]


def test_a_missed_ack_is_reported_when_the_deadline_passes_then_the_acknowledged_snapshot_returns(
    estate: Estate,
) -> None:
    estate.admin.wait_settled()
    acknowledged = estate.envoy.versions()
    estate.create_api("frozen", auth=OPEN)
    envoy_pid = estate.envoy.pid
    assert envoy_pid is not None
    os.kill(envoy_pid, signal.SIGSTOP)  # still connected, but answers nothing: the ACK never comes
    try:
        pushed = time.monotonic()
        generation = int(estate.admin.deploy("frozen"))
        failed = estate.admin.wait_failed(generation, timeout=4 * DEADLINE_S)
        reported_after = time.monotonic() - pushed
    finally:
        os.kill(envoy_pid, signal.SIGCONT)

    report = failed["last_report"]
    assert report["reason"] == "ACK_TIMEOUT"
    assert ENVOY_SAN in report["detail"]
    # At the deadline, not after a second one spent waiting for the restore to be acknowledged.
    assert DEADLINE_S <= reported_after < 1.5 * DEADLINE_S, reported_after
    wait_until(lambda: estate.envoy.versions() == acknowledged, 15, "Envoy back on the acknowledged snapshot")
    assert estate.gateway.get(estate.url("/apis/frozen/x")).status_code == 404


@pytest.mark.parametrize("missing", ["envoy", "authz"])
def test_a_publication_while_a_client_is_not_connected_fails_naming_it_then_syncs_once_it_connects(
    estate: Estate, missing: str
) -> None:
    site = estate.site
    assert site is not None
    assert site.envoy is not None
    assert site.authz is not None
    process, identity = {"envoy": (site.envoy, ENVOY_SAN), "authz": (site.authz, AUTHZ_SAN)}[missing]
    api_id = f"while-{missing}-away"
    estate.admin.wait_settled()
    estate.create_api(api_id, auth=OPEN)
    process.stop()
    try:
        wait_until(lambda: link_clients(estate)[identity] == 0, 10, f"the Link to see {identity} gone")
        generation = int(estate.admin.deploy(api_id))
        failed = estate.admin.wait_failed(generation, timeout=4 * DEADLINE_S)
    finally:
        process.start()

    report = failed["last_report"]
    assert report["reason"] == "ACK_TIMEOUT"
    assert f"{identity} (not connected)" in report["detail"]
    estate.admin.wait_synced(generation, timeout=30, past_failed=True)
    wait_until(
        lambda: estate.gateway.get(estate.url(f"/apis/{api_id}/x")).status_code == 200,
        10,
        f"/apis/{api_id} served",
    )
