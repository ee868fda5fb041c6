"""The Link's loop: guard → translate → publish → report, idempotence, coalescing, persistence."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import httpx
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from stoa_harness.wait import wait_until_async
from stoa_link.ads import PublishResult
from stoa_link.agent import Agent, InventoryStore
from stoa_link.cp_client import Changed, InvalidInventory
from stoa_link.guard import Refusal
from stoa_link.reporter import Reporter
from stoa_ops.backoff import Backoff
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_proto.inventory_delta import Elements, diff
from stoa_translate.snapshot import CLUSTER, Snapshot

FR = inventory_pb2.FailureReason


class FakeAds:
    """Stands in for the ADS server: records publications, answers with a scripted result."""

    def __init__(self) -> None:
        self.published: list[Snapshot] = []
        self.failure: PublishResult | None = None
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.clients = asyncio.Event()  # set: every client is connected

    async def wait_for_clients(self) -> None:
        await self.clients.wait()

    async def publish(self, snapshot: Snapshot) -> PublishResult:
        self.published.append(snapshot)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failure is not None:
            return dataclasses.replace(self.failure, version=snapshot.version)
        return PublishResult(True, snapshot.version)


def translate(inventory: inventory_pb2.Inventory) -> Snapshot:
    if any(p.type == "oidc" for p in inventory.policies):
        raise Refusal(FR.UNSUPPORTED_POLICY, "policy type oidc is not supported")
    clusters = [cluster_pb2.Cluster(name=r.route_id) for r in inventory.routes]
    return Snapshot.build(inventory.gateway_id, inventory.generation, {CLUSTER: clusters})


def inventory(generation: int, *routes: str, gateway: str = "gw") -> inventory_pb2.Inventory:
    inv = inventory_pb2.Inventory(
        schema_version=INVENTORY_SCHEMA_VERSION, gateway_id=gateway, generation=generation
    )
    for route in routes:
        inv.routes.add(route_id=route, api_id=route, tenant_id="t", upstream_url="http://127.0.0.1:1")
    return inv


@pytest.fixture
def received() -> list[dict]:
    return []


@pytest.fixture
def reporter(received: list[dict]) -> Reporter:
    def handler(request: httpx.Request) -> httpx.Response:
        received.append(json.loads(request.content))
        return httpx.Response(202)

    return Reporter(
        "http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=Backoff(0.001, 0.002)
    )


def make_agent(tmp_path: Path, reporter: Reporter, ads: FakeAds | None = None) -> Agent:
    return Agent("gw", ads or FakeAds(), reporter, translate, InventoryStore(tmp_path))  # type: ignore[arg-type]


async def test_success_persists_and_reports_synced_then_same_generation_is_a_no_op(
    tmp_path: Path, reporter: Reporter
) -> None:
    agent = make_agent(tmp_path, reporter)
    report = await agent.apply(inventory(1, "a"))
    assert report is not None
    assert report.status == inventory_pb2.SYNCED
    assert report.generation == 1
    assert report.snapshot_version == translate(inventory(1, "a")).version
    assert InventoryStore(tmp_path).load() == inventory(1, "a")
    assert await agent.apply(inventory(1, "a")) is None
    assert len(agent.ads.published) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("delivery", "reason"),
    [
        (inventory(2, "a", gateway="other"), FR.FOREIGN_GATEWAY),
        (inventory(0, "a"), FR.STALE_GENERATION),
        (inventory(1, "a", "b"), FR.STALE_GENERATION),  # generation 1 again, other content
        (inventory(2), FR.ROUTE_LOSS),
        (InvalidInventory(2, "not JSON"), FR.INVALID_INVENTORY),
    ],
)
async def test_refusals_are_reported_failed_and_nothing_is_published(
    tmp_path: Path, reporter: Reporter, delivery: inventory_pb2.Inventory | InvalidInventory, reason: int
) -> None:
    agent = make_agent(tmp_path, reporter)
    await agent.apply(inventory(1, "a"))
    report = await agent.apply(delivery)
    assert report is not None
    assert report.status == inventory_pb2.FAILED
    assert report.reason == reason
    assert report.detail
    assert report.gateway_id == "gw"
    assert len(agent.ads.published) == 1  # type: ignore[attr-defined]
    assert agent.last_applied == inventory(1, "a")


async def test_translator_refusal_is_reported_failed(tmp_path: Path, reporter: Reporter) -> None:
    agent = make_agent(tmp_path, reporter)
    bad = inventory(1, "a")
    bad.policies.add(policy_id="p", type="oidc", applicable=["a"])
    report = await agent.apply(bad)
    assert report is not None
    assert report.reason == FR.UNSUPPORTED_POLICY
    assert agent.ads.published == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("reason", ["NACK", "ACK_TIMEOUT"])
async def test_publish_failure_is_reported_with_envoy_detail_and_not_persisted(
    tmp_path: Path, reporter: Reporter, received: list[dict], reason: str
) -> None:
    ads = FakeAds()
    agent = make_agent(tmp_path, reporter, ads)
    await agent.apply(inventory(1, "a"))
    ads.failure = PublishResult(False, "", reason, "type.googleapis.com/x", "Envoy says no")
    report = await agent.apply(inventory(2, "a", "b"))
    assert report is not None
    assert report.status == inventory_pb2.FAILED
    assert FR.Name(report.reason) == reason
    assert report.detail == "Envoy says no"
    assert report.snapshot_version == translate(inventory(2, "a", "b")).version
    assert InventoryStore(tmp_path).load() == inventory(1, "a")
    task = asyncio.create_task(reporter.run())
    await asyncio.wait_for(reporter.wait_idle(), 5)
    task.cancel()
    # Only the latest report reaches the CP: the FAILED one superseded the SYNCED one.
    assert received[-1]["status"] == "FAILED"
    assert received[-1]["reason"] == reason


class FailOnce(FakeAds):
    """Fails its next publication only (then the scripted failure is spent)."""

    async def publish(self, snapshot: Snapshot) -> PublishResult:
        result = await super().publish(snapshot)
        self.failure = None
        return result


def revoking(delivery: inventory_pb2.Inventory, *digests: str) -> inventory_pb2.Inventory:
    delivery.revoked_key_sha256.extend(digests)
    return delivery


A, B, C = "aa" * 32, "bb" * 32, "cc" * 32


async def test_a_failed_generations_revocations_are_served_with_the_inventory_in_force(
    tmp_path: Path, reporter: Reporter
) -> None:
    ads = FailOnce()
    agent = make_agent(tmp_path, reporter, ads)
    await agent.apply(revoking(inventory(1, "a"), A))
    refused = revoking(inventory(2, "a", "b"), A, B)
    refused.policies.add(policy_id="p", type="oidc", applicable=["a"])
    report = await agent.apply(refused)
    assert report is not None
    assert (report.status, report.generation) == (inventory_pb2.FAILED, 2)
    # Generation 1 again, with the refused generation's revocation and nothing else of it.
    kept = revoking(inventory(1, "a"), A, B)
    assert (agent.last_applied, InventoryStore(tmp_path).load()) == (kept, kept)
    assert len(ads.published) == 2
    # Delivered again: nothing new to keep, nothing published.
    await agent.apply(refused)
    assert len(ads.published) == 2

    ads.failure = PublishResult(False, "", "NACK", "type.googleapis.com/x", "no")
    report = await agent.apply(revoking(inventory(3, "a", "c"), A, B, C))
    assert report is not None
    assert FR.Name(report.reason) == "NACK"
    kept = revoking(inventory(1, "a"), A, B, C)
    assert (agent.last_applied, InventoryStore(tmp_path).load()) == (kept, kept)
    assert [s.generation for s in ads.published] == [1, 1, 3, 1]


async def test_a_failed_generation_without_new_revocations_publishes_nothing_more(
    tmp_path: Path, reporter: Reporter
) -> None:
    ads = FakeAds()
    agent = make_agent(tmp_path, reporter, ads)
    await agent.apply(revoking(inventory(1, "a"), A))
    ads.failure = PublishResult(False, "", "NACK", "type.googleapis.com/x", "no")
    await agent.apply(revoking(inventory(2, "a", "b"), A))
    assert len(ads.published) == 2
    assert agent.last_applied == revoking(inventory(1, "a"), A)


async def test_deliveries_arriving_during_a_publication_coalesce_to_the_latest(
    tmp_path: Path, reporter: Reporter
) -> None:
    ads = FakeAds()
    ads.gate = asyncio.Event()
    agent = make_agent(tmp_path, reporter, ads)
    worker = asyncio.create_task(agent.work())
    agent.offer(inventory(1, "a"))
    await asyncio.wait_for(ads.started.wait(), 5)
    for generation in (2, 3, 4):
        agent.offer(inventory(generation, "a"))
    ads.gate.set()
    await asyncio.wait_for(agent.wait_idle(), 5)
    worker.cancel()
    assert [s.generation for s in ads.published] == [1, 4]
    assert agent.last_applied is not None
    assert agent.last_applied.generation == 4


async def test_restart_restores_the_persisted_inventory_before_anything_else(
    tmp_path: Path, reporter: Reporter
) -> None:
    await make_agent(tmp_path, reporter).apply(inventory(3, "a", "b"))
    ads = FakeAds()
    restarted = make_agent(tmp_path, reporter, ads)
    assert restarted.last_applied == inventory(3, "a", "b")
    worker = asyncio.create_task(restarted.work())
    restarted.offer(inventory(3, "a", "b"))
    await asyncio.wait_for(restarted.wait_idle(), 5)
    worker.cancel()
    assert [s.generation for s in ads.published] == [3]  # restored once; the same generation is a no-op


def test_state_of_another_gateway_refuses_to_start(tmp_path: Path, reporter: Reporter) -> None:
    InventoryStore(tmp_path).save(inventory(1, "a", gateway="other"))
    with pytest.raises(ValueError, match="STOA_LINK_STATE_DIR"):
        make_agent(tmp_path, reporter)


@pytest.mark.parametrize("crash_in", ["fsync", "replace"])
def test_state_file_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_in: str) -> None:
    """A crash while the new inventory is being written (before its data is durable, or just before
    the rename) leaves the previous file whole: the target is only ever replaced, never written."""
    store = InventoryStore(tmp_path / "state")
    store.save(inventory(1, "a"))
    before = store.path.read_bytes()

    def crash(*args: object) -> None:
        raise OSError(f"simulated crash in {crash_in}")

    with monkeypatch.context() as patched:
        patched.setattr(os, crash_in, crash)
        with pytest.raises(OSError, match="simulated crash"):
            store.save(inventory(2, "a", "b"))

    assert store.path.read_bytes() == before
    assert store.load() == inventory(1, "a")
    store.save(inventory(2, "a", "b"))
    assert store.load() == inventory(2, "a", "b")
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["last-applied-inventory.pb"]


def test_failure_detail_is_made_storable() -> None:
    from stoa_link.agent import MAX_DETAIL_CHARS, storable_detail

    assert storable_detail("bad\x00regex\ud800: (") == "bad regex : ("
    assert storable_detail("line one\nline two\ttab") == "line one\nline two\ttab"
    assert len(storable_detail("x" * 10_000)) == MAX_DETAIL_CHARS


def test_a_stored_inventory_of_another_schema_is_ignored_at_start(tmp_path: Path) -> None:
    # What a Link from before typed policy configs persisted: no schema_version, an untyped config.
    (tmp_path / "last-applied-inventory.json").write_text(
        '{"gateway_id": "gw", "generation": "3", "policies": [{"policy_id": "c", "type": "cors",'
        ' "config": {"allowedOrigins": ["*"]}}]}'
    )
    assert InventoryStore(tmp_path).load() is None


async def test_a_publication_a_missing_client_failed_is_made_again_once_every_client_is_connected(
    tmp_path: Path, reporter: Reporter, received: list[dict]
) -> None:
    ads = FakeAds()
    envoy = "spiffe://stoa.local/envoy"
    ads.failure = PublishResult(
        False, "", "ACK_TIMEOUT", CLUSTER, f"no ACK within 1s for: {envoy} (not connected)", missing=(envoy,)
    )
    agent = make_agent(tmp_path, reporter, ads)
    sender = asyncio.create_task(reporter.run())
    worker = asyncio.create_task(agent.work())
    try:
        agent.offer(inventory(1, "a"))
        await wait_until_async(lambda: received and received[-1]["status"] == "FAILED", 5, "FAILED reported")
        assert envoy in received[-1]["detail"]
        ads.failure = None
        ads.clients.set()  # the missing client connects
        await wait_until_async(lambda: received[-1]["status"] == "SYNCED", 5, "SYNCED reported")
    finally:
        worker.cancel()
        sender.cancel()
    assert received[-1]["generation"] == "1"
    assert [s.generation for s in ads.published] == [1, 1]
    assert agent.last_applied == inventory(1, "a")


def test_a_stored_json_inventory_is_read_then_replaced_by_the_binary_one(tmp_path: Path) -> None:
    # What a Link before binary state persisted.
    (tmp_path / "last-applied-inventory.json").write_text(
        '{"schema_version": 2, "gateway_id": "gw", "generation": "3", "routes": [{"route_id": "a"}]}'
    )
    store = InventoryStore(tmp_path)
    loaded = store.load()
    assert loaded is not None
    assert (loaded.generation, [r.route_id for r in loaded.routes]) == (3, ["a"])
    store.save(loaded)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last-applied-inventory.pb"]
    assert store.load() == loaded


def changed(old: inventory_pb2.Inventory, new: inventory_pb2.Inventory) -> Changed:
    """What the CP client gives for a delta event from `old` to `new`."""
    held = Elements.of(old)
    base_hash = held.hash()
    delta = diff(old, new)
    held.apply(delta)
    return Changed(delta, held, base_hash)


def agent_with_changes(tmp_path: Path, reporter: Reporter, calls: list[bool]) -> Agent:
    def translate_change(
        state: Elements, delta: inventory_pb2.InventoryDelta, base_is_latest: bool
    ) -> Snapshot:
        calls.append(base_is_latest)
        return translate(state.inventory())

    return Agent("gw", FakeAds(), reporter, translate, InventoryStore(tmp_path), translate_change)  # type: ignore[arg-type]


async def test_a_delta_on_the_inventory_in_force_goes_by_what_changed_and_is_recorded_as_a_change(
    tmp_path: Path, reporter: Reporter
) -> None:
    calls: list[bool] = []
    agent = agent_with_changes(tmp_path, reporter, calls)
    one, two, three = inventory(1, "a"), inventory(2, "a", "b"), inventory(3, "b", "c")
    three.tombstones.add(route_id="a", generation=3)
    assert (await agent.apply(one)).status == inventory_pb2.SYNCED  # type: ignore[union-attr]
    for old, new in ((one, two), (two, three)):
        report = await agent.apply(changed(old, new))
        assert report is not None
        assert report.status == inventory_pb2.SYNCED
        assert report.snapshot_version == translate(new).version
    # The first change's base was the last translation (of generation 1), and so was the second's.
    assert calls == [True, True]
    assert agent.last_applied == Elements.of(three).inventory()
    # Recorded as changes after the complete inventory, and read back whole by a restarted Link.
    assert (tmp_path / "last-applied-inventory.changes").stat().st_size > 0
    assert InventoryStore(tmp_path).load() == Elements.of(three).inventory()


async def test_a_delta_losing_a_route_without_a_tombstone_is_refused(
    tmp_path: Path, reporter: Reporter
) -> None:
    agent = agent_with_changes(tmp_path, reporter, [])
    one = inventory(1, "a", "b")
    await agent.apply(one)
    report = await agent.apply(changed(one, inventory(2, "a")))
    assert report is not None
    assert (report.status, report.reason) == (inventory_pb2.FAILED, FR.ROUTE_LOSS)
    assert report.detail == "routes missing without a tombstone: b"
    assert agent.last_applied == one
    # The next delta applies to the refused generation, not the one in force: it is taken whole.
    report = await agent.apply(changed(inventory(2, "a"), inventory(3, "a", "b")))
    assert report is not None
    assert report.status == inventory_pb2.SYNCED
    assert agent.last_applied == inventory(3, "a", "b")


def test_a_change_record_cut_short_is_ignored_and_the_rest_is_read_back(tmp_path: Path) -> None:
    store = InventoryStore(tmp_path)
    one, two = inventory(1, "a"), inventory(2, "a", "b")
    store.save(one)
    store.append(diff(one, two))
    store.append(diff(two, inventory(3, "a", "b", "c")))
    path = tmp_path / "last-applied-inventory.changes"
    path.write_bytes(path.read_bytes()[:-3])  # a crash while the second record was written
    assert InventoryStore(tmp_path).load() == Elements.of(two).inventory()
    # Written whole again: the changes are gone, the inventory is the one saved.
    store.save(two)
    assert not path.exists()
    assert InventoryStore(tmp_path).load() == two


def test_a_change_recorded_after_a_cut_record_is_read_back_by_the_next_restart(tmp_path: Path) -> None:
    one, two, three = inventory(1, "a"), inventory(2, "a", "b"), inventory(3, "a", "b", "c")
    first = InventoryStore(tmp_path)
    first.save(one)
    first.append(diff(one, two))
    first.append(diff(two, three))
    path = tmp_path / "last-applied-inventory.changes"
    path.write_bytes(path.read_bytes()[:-3])  # a crash while the second record was written
    restarted = InventoryStore(tmp_path)
    assert restarted.load() == Elements.of(two).inventory()
    # The restarted Link applies generation 3 again and records it: a second restart reads it back.
    restarted.append(diff(two, three))
    assert InventoryStore(tmp_path).load() == Elements.of(three).inventory()
