"""The CP's database restored from a backup, behind what the Link applied (issue 10): the Link resumes
with a `Last-Event-ID` above the CP's generation. The CP moves the gateway's generation above it (and
logs why), so the next publication is accepted and served through Envoy instead of refused as stale
or never sent. CP + Link + real Envoy + embedded PostgreSQL, the backup taken with pg_dump."""

from __future__ import annotations

from collections.abc import Callable

from stoa_harness.estate import Estate
from stoa_harness.wait import wait_until

OPEN = {"mode": "none"}  # routes Envoy serves without a Check: what is asserted is the publication


def serves(estate: Estate, api_id: str) -> bool:
    return estate.gateway.get(estate.url(f"/apis/{api_id}/x")).status_code == 200


def test_a_link_ahead_of_a_restored_database_gets_the_next_publication(
    estates: Callable[..., Estate],
) -> None:
    estate = estates(name="estate-restored")
    assert estate.postgres is not None
    database = estate.database_url.rsplit("/", 1)[1]
    estate.admin.wait_synced(estate.publish("kept", auth=OPEN))
    backup = estate.postgres.dump(database)
    restored_generation = estate.admin.desired_generation()
    # Published after the backup: the Link goes on to generations the restored database never had
    # (a route deployed, then removed again, so the restored state loses no route the Link serves).
    estate.admin.wait_synced(estate.publish("interim", auth=OPEN))
    applied = estate.admin.wait_synced(estate.admin.undeploy("interim"))["acknowledged_generation"]
    assert applied > restored_generation

    estate.stop_cp()
    estate.postgres.restore(database, backup)
    estate.start_cp()

    # The Link resumes with Last-Event-ID = its applied generation; the CP moves above it.
    wait_until(lambda: estate.admin.desired_generation() > applied, 60, "the gateway's generation moved")
    estate.admin.wait_synced(estate.publish("after", auth=OPEN), timeout=60)
    wait_until(lambda: serves(estate, "after"), 15, "/apis/after served through Envoy")
    assert serves(estate, "kept")
    cp_log = (estate.run_dir / "cp.log").read_text()
    assert f"generation_moved gateway={estate.gateway_id} from={restored_generation}" in cp_log, cp_log[
        -2000:
    ]
