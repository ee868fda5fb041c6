"""The Link's loop: inventory → guard → translate → publish → report.

Only the newest pending inventory matters: deliveries that arrive while one is being published are
coalesced to the latest. The last applied inventory is persisted in STATE_DIR, so a restarted Link
serves it again and keeps refusing what the guard refused before.

A publication that failed because a client (Envoy, stoa-authz) had no stream open is reported FAILED
at its deadline, naming the client, and made again as soon as every client is connected, unless a
newer delivery came first: it then ends SYNCED (or FAILED for a reason of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_proto.inventory_delta import DeltaMismatch, Elements
from stoa_translate.snapshot import Snapshot

from stoa_link import guard
from stoa_link.ads import AdsServer, elapsed_ms
from stoa_link.cp_client import Changed, CpClient, Delivery, InvalidInventory, ToolPermissions, schema_refusal
from stoa_link.metrics import PublicationStats
from stoa_link.reporter import Reporter

log = logging.getLogger("stoa_link.agent")

FailureReason = inventory_pb2.FailureReason
Translate = Callable[[inventory_pb2.Inventory], Snapshot]
# (the complete inventory, the delta that gave it, whether the latest translation was of its base).
TranslateChange = Callable[[Elements, inventory_pb2.InventoryDelta, bool], Snapshot]

STATE_FILE = "last-applied-inventory.pb"
# The deltas applied since STATE_FILE was written, appended one record each.
CHANGES_FILE = "last-applied-inventory.changes"
# What Links before binary state wrote; read when there is no STATE_FILE yet.
LEGACY_STATE_FILE = "last-applied-inventory.json"
# A record: the length and CRC-32 of the serialised InventoryDelta, then it.
_RECORD_HEADER = 8


class InventoryStore:
    """The last applied inventory on disk: a complete inventory as deterministic protobuf, written
    atomically (temp file, fsync, rename), and the deltas applied since, appended (and fsynced) one
    record each, so a change costs its own bytes, not the 10,000 routes'. A record cut short by a crash
    is ignored (its generation was not reported SYNCED: the CP gives it again); each record is checked
    against its delta's hash as it is read back. Once the records outgrow the complete inventory, the
    agent writes the inventory again (`save`), which empties them."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        self.changes_path = state_dir / CHANGES_FILE
        self.legacy_path = state_dir / LEGACY_STATE_FILE
        self._saved_bytes = 0
        self._changes_bytes = 0

    def load(self) -> inventory_pb2.Inventory | None:
        if self.path.exists():
            try:
                data = self.path.read_bytes()
                inventory = inventory_pb2.Inventory.FromString(data)
            except DecodeError as exc:
                raise ValueError(
                    f"{self.path} is not a valid inventory ({exc}); move it away to start afresh"
                ) from exc
            if inventory.schema_version != INVENTORY_SCHEMA_VERSION:
                self._ignored(self.path, f"inventory schema_version {inventory.schema_version}")
                return None
            self._saved_bytes = len(data)
            return self._with_changes(inventory)
        if not self.legacy_path.exists():
            return None
        text = self.legacy_path.read_text()
        refused = schema_refusal(text, 0)
        if refused is not None:
            # Written by a Link of another inventory schema (an upgrade): start as a fresh Link would.
            self._ignored(self.legacy_path, refused.detail)
            return None
        try:
            return json_format.Parse(text, inventory_pb2.Inventory())
        except json_format.ParseError as exc:
            raise ValueError(
                f"{self.legacy_path} is not a valid inventory ({exc}); move it away to start afresh"
            ) from exc

    @staticmethod
    def _ignored(path: Path, detail: str) -> None:
        log.warning("stored_inventory_ignored", extra={"fields": {"path": str(path), "detail": detail}})

    def _with_changes(self, inventory: inventory_pb2.Inventory) -> inventory_pb2.Inventory:
        """`inventory` with the recorded deltas that follow it applied (records of generations it
        already holds were written before it and are skipped)."""
        if not self.changes_path.exists():
            return inventory
        data = self.changes_path.read_bytes()
        self._changes_bytes = len(data)
        state: Elements | None = None
        at = 0
        while at + _RECORD_HEADER <= len(data):
            size, crc = int.from_bytes(data[at : at + 4], "big"), int.from_bytes(data[at + 4 : at + 8], "big")
            record = data[at + _RECORD_HEADER : at + _RECORD_HEADER + size]
            if len(record) < size or zlib.crc32(record) != crc:
                self._ignored(self.changes_path, f"a record cut short at byte {at}")
                # Cut off, so the next record is appended after the last whole one and is read back.
                os.truncate(self.changes_path, at)
                self._changes_bytes = at
                break
            at += _RECORD_HEADER + size
            delta = inventory_pb2.InventoryDelta.FromString(record)
            if delta.generation <= (state.generation if state else inventory.generation):
                continue
            state = state or Elements.of(inventory)
            try:
                state.apply(delta)
            except DeltaMismatch as exc:
                raise ValueError(
                    f"{self.changes_path} does not follow {self.path} ({exc}); move both away to start afresh"
                ) from exc
        return inventory if state is None else state.inventory()

    def append(self, delta: inventory_pb2.InventoryDelta) -> bool:
        """Record `delta`, applied to the stored inventory; True when the records have outgrown the
        complete inventory (the caller then `save`s it)."""
        record = delta.SerializeToString(deterministic=True)
        frame = len(record).to_bytes(4, "big") + zlib.crc32(record).to_bytes(4, "big") + record
        created = not self.changes_path.exists()
        fd = os.open(self.changes_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as fh:
            fh.write(frame)
            fh.flush()
            os.fsync(fh.fileno())
        if created:
            self._sync_dir()
        self._changes_bytes += len(frame)
        return self._changes_bytes > max(self._saved_bytes, 64 * 1024)

    def save(self, inventory: inventory_pb2.Inventory) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = inventory.SerializeToString(deterministic=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        # The rename made durable before the records go: a crash in between leaves records the new
        # inventory already holds (skipped at load), never the old inventory without its records.
        self._sync_dir()
        self.changes_path.unlink(missing_ok=True)
        self.legacy_path.unlink(missing_ok=True)
        self._sync_dir()
        self._saved_bytes, self._changes_bytes = len(data), 0

    def _sync_dir(self) -> None:
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# How long the worker waits after a complete publication before preparing for changes (a change
# arriving sooner prepares them itself).
IDLE_BEFORE_PREPARE_S = 0.2

# Envoy's error details can be long and may hold any byte; the CP refuses what it cannot store, and a
# refused report would be lost, so the detail is made storable here.
MAX_DETAIL_CHARS = 4000


def storable_detail(detail: str) -> str:
    cleaned = "".join(c if c.isprintable() or c in "\n\t" else " " for c in detail)
    return cleaned.encode("utf-8", "replace").decode("utf-8")[:MAX_DETAIL_CHARS]


def _failed(
    gateway_id: str, generation: int, reason: int, detail: str, version: str = ""
) -> inventory_pb2.SyncReport:
    return inventory_pb2.SyncReport(
        gateway_id=gateway_id,
        generation=generation,
        status=inventory_pb2.FAILED,
        reason=reason,
        detail=storable_detail(detail),
        snapshot_version=version,
    )


class Agent:
    def __init__(
        self,
        gateway_id: str,
        ads: AdsServer,
        reporter: Reporter,
        translate: Translate,
        store: InventoryStore,
        translate_change: TranslateChange | None = None,
        prepare_changes: Callable[[], None] | None = None,
    ) -> None:
        """`translate_change`: translates a delta's complete inventory by what changed (the Link's
        `Translator.translate_change`); without it a delta's inventory is translated whole.
        `prepare_changes`: run once idle after a complete inventory was published, so the first change
        after it does not pay for what the changes need (`Translator.prepare_changes`)."""
        self.gateway_id = gateway_id
        self.ads = ads
        self.reporter = reporter
        self.translate = translate
        self.translate_change = translate_change
        self.prepare_changes = prepare_changes
        self._prepare_pending = False
        self.store = store
        # The inventory in force, as a message and as elements (each made from the other when asked).
        self._applied: inventory_pb2.Inventory | None = store.load()
        self._applied_elements: Elements | None = None
        # Whether the translator's latest translation was of the inventory in force.
        self._translated_applied = False
        if self._applied is not None and self._applied.gateway_id != gateway_id:
            raise ValueError(
                f"{store.path} holds gateway {self._applied.gateway_id!r}, "
                f"this Link serves {gateway_id!r}: "
                "point STOA_LINK_STATE_DIR at this gateway's own directory"
            )
        self.stats = PublicationStats()
        self._latest: Delivery | None = None
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # What to do again once every ADS client is connected (a publication one of them missed).
        self._again: Callable[[], Awaitable[None]] | None = None

    @property
    def last_applied(self) -> inventory_pb2.Inventory | None:
        """The inventory in force: the last one applied (acknowledged), or loaded at start."""
        if self._applied is None and self._applied_elements is not None:
            self._applied = self._applied_elements.inventory()
        return self._applied

    def _in_force(self, inventory: inventory_pb2.Inventory | None, elements: Elements | None = None) -> None:
        self._applied, self._applied_elements = inventory, elements

    def _elements_in_force(self) -> Elements | None:
        if self._applied_elements is None and self._applied is not None:
            self._applied_elements = Elements.of(self._applied)
        return self._applied_elements

    # ---- intake --------------------------------------------------------------------------------

    def offer(self, delivery: Delivery) -> None:
        """Hand a delivery to the worker; an older one not yet started is dropped for it."""
        self.stats.desired_generation_seen = max(self.stats.desired_generation_seen, delivery.generation)
        if self._latest is not None:
            log.info(
                "inventory_coalesced",
                extra={
                    "fields": {
                        "dropped_generation": self._latest.generation,
                        "generation": delivery.generation,
                    }
                },
            )
        self._latest = delivery
        self._idle.clear()
        self._arrived.set()

    async def wait_idle(self) -> None:
        """Until every offered delivery has been handled."""
        await self._idle.wait()

    async def follow(self, cp: CpClient) -> None:
        async for delivery in cp.deliveries():
            if isinstance(delivery, ToolPermissions):
                # Its own event: served at once, not a generation, never rolled back with a snapshot.
                self.ads.serve_permissions(delivery.seq, delivery.jws)
                continue
            self.offer(delivery)

    async def work(self) -> None:
        await self.restore()
        while True:
            await self._until_delivery()
            self._arrived.clear()
            while self._latest is not None:
                delivery, self._latest = self._latest, None
                try:
                    await self.apply(delivery)
                except Exception as exc:  # fail closed: report, keep serving the acknowledged snapshot
                    log.exception("apply_crashed", extra={"fields": {"generation": delivery.generation}})
                    self.reporter.submit(
                        _failed(
                            self.gateway_id,
                            delivery.generation,
                            FailureReason.INVALID_INVENTORY,
                            f"internal error: {exc!r}",
                        )
                    )
            self._idle.set()

    async def _until_delivery(self) -> None:
        """Until a delivery arrives; meanwhile, a publication a missing client failed is made again
        once every client is connected, and what the changes need is prepared once idle."""
        if self._prepare_pending and self.prepare_changes is not None:
            self._prepare_pending = False
            with contextlib.suppress(TimeoutError):
                # Idle only once the report went out and nothing came right after it.
                await asyncio.wait_for(self._arrived.wait(), IDLE_BEFORE_PREPARE_S)
            if not self._arrived.is_set():
                self.prepare_changes()
        while not self._arrived.is_set():
            if self._again is None:
                await self._arrived.wait()
                return
            arrived = asyncio.create_task(self._arrived.wait())
            connected = asyncio.create_task(self.ads.wait_for_clients())
            try:
                await asyncio.wait({arrived, connected}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrived.cancel()
                connected.cancel()
            if connected.done() and not connected.cancelled() and not self._arrived.is_set():
                again, self._again = self._again, None
                log.info("clients_connected_publishing_again")
                if again is not None:
                    await again()

    # ---- one inventory ---------------------------------------------------------------------------

    async def restore(self) -> None:
        """Serve the persisted inventory again, so a reconnecting Envoy gets what it was last given."""
        if self.last_applied is None:
            return
        try:
            snapshot = self.translate(self.last_applied)
            self._translated_applied = True
        except guard.Refusal as refusal:
            log.error(
                "restore_refused",
                extra={"fields": {"generation": self.last_applied.generation, "detail": str(refusal)}},
            )
            return
        self._again = None
        result = await self.ads.publish(snapshot)
        if result.missing:
            self._again = self.restore
        log.info(
            "restored",
            extra={
                "fields": {
                    "generation": self.last_applied.generation,
                    "version": snapshot.version,
                    "acked": result.acked,
                    "detail": result.detail,
                }
            },
        )

    async def apply(self, delivery: Delivery) -> inventory_pb2.SyncReport | None:
        """Handle one delivery; the report it submitted, or None for a no-op."""
        if isinstance(delivery, InvalidInventory):
            return self._report(
                _failed(
                    self.gateway_id, delivery.generation, FailureReason.INVALID_INVENTORY, delivery.detail
                )
            )
        started = time.perf_counter()
        timings: dict[str, float] = {}
        change = self._change_in_force(delivery) if isinstance(delivery, Changed) else None
        # Made from the elements only where needed (a refusal, a failed publication): 10,000 routes.
        last = self.last_applied if change is None else None
        inventory: inventory_pb2.Inventory | None = None
        if change is None:
            inventory = delivery.inventory() if isinstance(delivery, Changed) else delivery
            # The same generation delivered again (a resume, a reconnect) is a no-op; the same
            # generation with other content is a rewrite of history and goes on to the guard, which
            # refuses it as stale.
            if last is not None and inventory == last:
                log.info("inventory_unchanged", extra={"fields": {"generation": inventory.generation}})
                return None
        try:
            mark = time.perf_counter()
            if change is not None:
                guard.check_change(change.delta, change.state, self._elements_in_force(), self.gateway_id)
            else:
                guard.check(inventory, last, self.gateway_id)  # type: ignore[arg-type]
            timings["guard_ms"] = elapsed_ms(mark)
            mark = time.perf_counter()
            if change is not None and self.translate_change is not None:
                snapshot = self.translate_change(change.state, change.delta, self._translated_applied)
            else:
                inventory = inventory or delivery.inventory()  # type: ignore[union-attr]
                snapshot = self.translate(inventory)
            self._translated_applied = False
            timings["translate_ms"] = elapsed_ms(mark)
        except guard.Refusal as refusal:
            await self._keep_revocations(inventory or delivery.inventory(), self.last_applied)  # type: ignore[union-attr]
            return self._report(
                _failed(self.gateway_id, delivery.generation, refusal.reason, refusal.detail),
                timings | {"total_ms": elapsed_ms(started)},
            )
        log.info(
            "publishing",
            extra={
                "fields": {
                    "generation": delivery.generation,
                    "version": snapshot.version,
                    "routes": len(change.state.lists["routes"]) if change else len(inventory.routes),  # type: ignore[union-attr]
                    "incremental": change is not None,
                    **timings,
                }
            },
        )
        self._again = None  # this publication supersedes one waiting for a client
        result = await self.ads.publish(snapshot)
        timings.update(result.timings)
        if result.missing:

            async def offer_again() -> None:
                self.offer(delivery)

            self._again = offer_again
        if not result.acked:
            await self._keep_revocations(inventory or delivery.inventory(), self.last_applied)  # type: ignore[union-attr]
            reason = FailureReason.Value(result.reason)
            return self._report(
                _failed(self.gateway_id, delivery.generation, reason, result.detail, snapshot.version),
                timings | {"total_ms": elapsed_ms(started)},
            )
        mark = time.perf_counter()
        fold = False
        if change is not None:
            fold = self.store.append(change.delta)
            self._in_force(None, change.state)
        else:
            self.store.save(inventory)  # type: ignore[arg-type]
            self._in_force(inventory, delivery.state if isinstance(delivery, Changed) else None)
        self._translated_applied = True
        timings["store_ms"] = elapsed_ms(mark)
        report = self._report(
            inventory_pb2.SyncReport(
                gateway_id=self.gateway_id,
                generation=delivery.generation,
                status=inventory_pb2.SYNCED,
                snapshot_version=snapshot.version,
            ),
            timings | {"total_ms": elapsed_ms(started)},
        )
        if fold:  # after the report: the recorded deltas become one complete inventory again
            self.store.save(self.last_applied)  # type: ignore[arg-type]
        if change is None:
            self._prepare_pending = True
            # The complete inventory's objects (10,000 routes' IR, entries, resources) live until the
            # next complete one: kept out of the cyclic collector's passes, which otherwise walk them
            # all, again and again, while a change allocates (they are freed by reference counts).
            gc.freeze()
        return report

    def _change_in_force(self, delivery: Changed) -> Changed | None:
        """`delivery` when it applies to the inventory in force (so guard and translation may go by
        what changed), else None (a delivery coalesced away, a refused or kept-back generation)."""
        held = self._elements_in_force()
        if held is None or held.generation != delivery.delta.base_generation:
            return None
        return delivery if held.hash() == delivery.base_hash else None

    async def _keep_revocations(
        self, failed: inventory_pb2.Inventory, last: inventory_pb2.Inventory | None
    ) -> None:
        """Revocations are never rolled back: when a generation that revokes keys is refused or not
        acknowledged, the inventory in force is served again with those revocations added (and
        nothing else of the failed generation), and kept as the one in force (a restart keeps them)."""
        if last is None:
            return  # nothing was ever served here: no key of this site can be in use
        added = set(failed.revoked_key_sha256) - set(last.revoked_key_sha256)
        if not added:
            return
        kept = inventory_pb2.Inventory()
        kept.CopyFrom(last)
        kept.revoked_key_sha256[:] = sorted(set(last.revoked_key_sha256) | added)
        fields = {"generation": failed.generation, "in_force": last.generation, "revocations": len(added)}
        try:
            snapshot = self.translate(kept)
            self._translated_applied = False
        except guard.Refusal as refusal:
            log.error("revocations_not_kept", extra={"fields": fields | {"detail": refusal.detail}})
            return
        result = await self.ads.publish(snapshot)
        if not result.acked:
            log.error("revocations_not_kept", extra={"fields": fields | {"detail": result.detail}})
            return
        self.store.save(kept)
        self._in_force(kept)
        self._translated_applied = True
        log.info("revocations_kept", extra={"fields": fields | {"version": snapshot.version}})

    def _report(
        self, report: inventory_pb2.SyncReport, timings: dict[str, float] | None = None
    ) -> inventory_pb2.SyncReport:
        """Log and submit `report`; `timings` are the stages (ms) that led to it, for operators."""
        log.info(
            "sync_report",
            extra={
                "fields": {
                    "generation": report.generation,
                    "status": inventory_pb2.SyncStatus.Name(report.status),
                    "reason": FailureReason.Name(report.reason),
                    "detail": report.detail,
                    "snapshot_version": report.snapshot_version,
                    **(timings or {}),
                }
            },
        )
        failed = report.status != inventory_pb2.SYNCED
        reason = FailureReason.Name(report.reason) if failed else "none"
        self.stats.reports.labels("failed" if failed else "synced", reason).inc()
        if timings and "total_ms" in timings:
            self.stats.publish_seconds.observe(timings["total_ms"] / 1000)
        self.reporter.submit(report)
        return report


async def run_agent(agent: Agent, cp: CpClient) -> None:
    """Run the worker, the CP follower and the reporter until cancelled."""
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(agent.reporter.run())
        tasks.create_task(agent.work())
        tasks.create_task(agent.follow(cp))
