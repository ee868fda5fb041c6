"""Publication order: how a snapshot reaches every client, and how a failed one is taken back.

1. Each site service's policy set, and its ACK: a route must never reach Envoy before the policy
   set it was built with is in force.
2. Envoy's types together: clusters as the union of those served so far and the new ones, the
   listener, the route scopes (if any) and the route configurations; their ACKs (and, for route
   configurations Envoy asks for by name, every one of them held at its version).
   When the snapshot switches the routing (one route table ↔ scopes), the listener is replaced, and
   Envoy keeps the one it replaces accepting connections until the new one is warm: the scopes and
   tables the old listener reads are kept as they were served (`routing_bridge`), and the new ones
   added beside them.
3. After a switch, the snapshot's own scopes and tables, once the new listener is acknowledged and
   holds its tables (the one table served closed, or the old scopes gone).
4. The new clusters alone, once the routes that stopped using the others are acknowledged.

A NACK or a missed ACK deadline fails the publication: the failure is returned at once (so it is
reported when the deadline passes), and the last acknowledged snapshot is then put back everywhere in
the background; the next publication starts once that restore has finished. A client that has no
stream open is waited for like a silent one, up to the deadline: it is named in the failure
(`missing`), so the caller can publish again once it connects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message
from stoa_translate.routes import ROUTE_CONFIG_NAME as ONE_TABLE
from stoa_translate.snapshot import (
    CLUSTER,
    ENVOY_TYPES,
    LISTENER,
    ROUTE,
    SCOPED_ROUTE,
    SITE_SERVICE_TYPES,
    Snapshot,
    resource_name,
)

from stoa_link.ads.stream import Served, Streams, short

log = logging.getLogger("stoa_link.ads")


@dataclass(frozen=True)
class PublishResult:
    acked: bool
    version: str
    # On failure: "NACK" or "ACK_TIMEOUT", the type that failed and Envoy's (or the client's) error detail.
    reason: str = ""
    failed_type: str = ""
    detail: str = ""
    # On ACK_TIMEOUT: the client identities that had no stream open when the deadline passed.
    missing: tuple[str, ...] = ()
    # Milliseconds per stage (packing, each ACK wait), for the Link's logs.
    timings: Mapping[str, float] = field(default_factory=dict)


def routing_bridge(
    tables: Served | None, scopes: Served | None, snapshot: Snapshot
) -> tuple[tuple[Message, ...], tuple[Message, ...]] | None:
    """The (scopes, route tables) to serve while `snapshot` switches the routing away from the one
    served (`tables`, `scopes`: what is served now): the new ones, and what the replaced listener reads
    kept as it was. None when the routing does not switch."""
    if tables is None:
        return None
    was_one_table = ONE_TABLE in tables.entries and ONE_TABLE not in tables.on_request
    new_tables = snapshot.of(ROUTE)
    one_table = ONE_TABLE not in snapshot.on_request and any(
        resource_name(t) == ONE_TABLE for t in new_tables
    )
    if was_one_table == one_table:
        return None
    if one_table:  # back from scopes: the scopes and their tables stay
        kept = {resource_name(t): t for t in tables.resources} | {resource_name(t): t for t in new_tables}
        return (scopes.resources if scopes else ()), tuple(kept[name] for name in sorted(kept))
    old = tables.entries[ONE_TABLE][0]  # to scopes: the one table stays as it was, not closed yet
    return snapshot.of(SCOPED_ROUTE), tuple(old if resource_name(t) == ONE_TABLE else t for t in new_tables)


def elapsed_ms(since: float) -> float:
    """Milliseconds since `since` (a `time.perf_counter()` reading), for stage timings in logs."""
    return round((time.perf_counter() - since) * 1000, 2)


class Publisher:
    """Publishes snapshots through `streams` to every identity of `allowed` (identity → type URLs)."""

    def __init__(self, streams: Streams, allowed: Mapping[str, frozenset[str]], ack_timeout_s: float) -> None:
        self._streams = streams
        self._allowed = allowed
        self.ack_timeout_s = ack_timeout_s
        self.acked: Snapshot | None = None
        self._lock = asyncio.Lock()
        self._restoring: asyncio.Task[None] | None = None

    async def wait_for_clients(self) -> None:
        """Until every client identity has a stream open."""
        while not all(self._streams.connected(i) for i in self._allowed):
            await self._streams.next_change(None)

    def cancel_restore(self) -> None:
        """Stop a restore under way (the server is stopping)."""
        if self._restoring is not None:
            self._restoring.cancel()
            self._restoring = None

    async def settled(self) -> None:
        """Until no publication, and no restore after a failed one, is under way."""
        async with self._lock:
            await self._restored()

    async def _restored(self) -> None:
        if self._restoring is not None:
            task, self._restoring = self._restoring, None
            await task

    async def publish(self, snapshot: Snapshot) -> PublishResult:
        """Serve `snapshot` to every client; SYNCED-worthy only when every client ACKed every type."""
        async with self._lock:
            started = time.perf_counter()
            await self._restored()
            timings: dict[str, float] = {"restore_wait_ms": elapsed_ms(started)}
            result = await self._apply(snapshot, timings)
            timings["publish_ms"] = elapsed_ms(started)
            result = dataclasses.replace(result, timings=timings)
            if result.acked:
                self.acked = snapshot
                log.info(
                    "ads_published",
                    extra={"fields": {"version": snapshot.version, "generation": snapshot.generation}},
                )
                return result
            log.warning(
                "ads_publish_failed",
                extra={
                    "fields": {
                        "version": snapshot.version,
                        "reason": result.reason,
                        "type": short(result.failed_type),
                        "detail": result.detail,
                    }
                },
            )
            # Returned before the restore: it waits for ACKs too, and the failure must be reported
            # when the deadline passes, not one deadline later.
            self._restoring = asyncio.create_task(self._restore(), name="ads-restore")
            return result

    async def _restore(self) -> None:
        """Put the last acknowledged snapshot back everywhere; a failure is logged, never raised."""
        if self.acked is None:
            # Nothing was ever acknowledged: stop offering the refused content to clients that connect.
            self._streams.withdraw()
            return
        try:
            back = await self._apply(self.acked, {})
        except Exception:  # a restore crashing must not fail the next publication, which awaits it
            log.exception("ads_restore_crashed", extra={"fields": {"version": self.acked.version}})
            return
        if not back.acked:
            log.error(
                "ads_restore_failed",
                extra={
                    "fields": {
                        "version": self.acked.version,
                        "reason": back.reason,
                        "type": short(back.failed_type),
                        "detail": back.detail,
                    }
                },
            )

    def _readers(self, types: Iterable[str]) -> list[str]:
        wanted = set(types)
        return [san for san, allowed in self._allowed.items() if allowed & wanted]

    async def _apply(self, snapshot: Snapshot, timings: dict[str, float]) -> PublishResult:
        streams, version = self._streams, snapshot.version
        # Site services first: a route must never reach Envoy before its policy set is in force.
        for type_url in SITE_SERVICE_TYPES:
            readers = self._readers([type_url])
            if not readers or type_url not in snapshot.resources:
                continue
            mark = time.perf_counter()
            digest = streams.serve(type_url, version, snapshot.of(type_url), snapshot.bodies)
            timings[f"{short(type_url)}_serve_ms"] = elapsed_ms(mark)
            failure = await self._wait_acked({type_url: digest}, readers, version)
            timings[f"{short(type_url)}_ack_ms"] = elapsed_ms(mark)
            if failure:
                return failure
        readers = self._readers(ENVOY_TYPES)
        if not readers:
            return PublishResult(True, version)
        # Clusters leave only after the routes that stop using them are acknowledged: first serve
        # the union of the clusters served so far and the new ones, then the new ones alone.
        new_clusters = {resource_name(c): c for c in snapshot.of(CLUSTER)}
        previous = streams.served(CLUSTER)
        union = {resource_name(c): c for c in (previous.resources if previous else ())} | new_clusters
        cds_version = version if union.keys() == new_clusters.keys() else f"{version}+{previous.version}"  # type: ignore[union-attr]
        mark, pushed_at = time.perf_counter(), time.monotonic()
        bodies = snapshot.bodies
        bridge = routing_bridge(streams.served(ROUTE), streams.served(SCOPED_ROUTE), snapshot)
        targets = {
            CLUSTER: streams.serve(CLUSTER, cds_version, tuple(union[n] for n in sorted(union)), bodies)
        }
        if bridge is None:
            targets[LISTENER] = streams.serve(LISTENER, version, snapshot.of(LISTENER), bodies)
            # Scopes and the route tables they name (none when the listener names one table).
            targets.update(self._serve_routing(snapshot))
        else:
            # The routing before the listener: Envoy shares a route table (or the scopes) by name
            # between listeners, so the new one may find the copy a draining listener of an earlier
            # switch holds, and would serve it as it was until the update came.
            targets.update(self._serve_bridge(snapshot, bridge))
            targets[LISTENER] = streams.serve(LISTENER, version, snapshot.of(LISTENER), bodies)
        timings["envoy_serve_ms"] = elapsed_ms(mark)
        failure = await self._wait_acked(targets, readers, version)
        timings["envoy_ack_ms"] = elapsed_ms(mark)
        timings.update(streams.ack_times(targets, readers, since=pushed_at))
        if failure:
            return failure
        if bridge is not None:
            mark = time.perf_counter()
            failure = await self._wait_acked(self._serve_routing(snapshot), readers, version)
            timings["routing_switch_ack_ms"] = elapsed_ms(mark)
            if failure:
                return failure
        if cds_version != version:
            mark = time.perf_counter()
            digest = streams.serve(CLUSTER, version, snapshot.of(CLUSTER), snapshot.bodies)
            failure = await self._wait_acked({CLUSTER: digest}, readers, version)
            timings["cds_removal_ack_ms"] = elapsed_ms(mark)
            if failure:
                return failure
        return PublishResult(True, version)

    def _serve_routing(self, snapshot: Snapshot) -> dict[str, str]:
        """Serve the snapshot's scopes and route tables; their content digests by type."""
        streams, version, bodies = self._streams, snapshot.version, snapshot.bodies
        edit = snapshot.edits.get(SCOPED_ROUTE)
        return {
            SCOPED_ROUTE: streams.serve(SCOPED_ROUTE, version, snapshot.of(SCOPED_ROUTE), bodies, edit),
            ROUTE: streams.serve(ROUTE, version, snapshot.of(ROUTE), bodies, on_request=snapshot.on_request),
        }

    def _serve_bridge(
        self, snapshot: Snapshot, bridge: tuple[tuple[Message, ...], tuple[Message, ...]]
    ) -> dict[str, str]:
        """Serve `routing_bridge`'s scopes and tables under a version of their own."""
        version, bodies = f"{snapshot.version}+switch", snapshot.bodies
        return {
            SCOPED_ROUTE: self._streams.serve(SCOPED_ROUTE, version, bridge[0], bodies),
            ROUTE: self._streams.serve(ROUTE, version, bridge[1], bodies),
        }

    async def _wait_acked(
        self, targets: Mapping[str, str], readers: list[str], version: str
    ) -> PublishResult | None:
        """None once every stream of every reader acknowledged each target (type URL → content
        digest); a failure otherwise."""
        deadline = time.monotonic() + self.ack_timeout_s
        while True:
            progress = self._streams.progress(targets, readers)
            if progress.nack is not None:
                return PublishResult(False, version, "NACK", *progress.nack)
            if not progress.pending:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                detail = f"no ACK within {self.ack_timeout_s:g}s for: {', '.join(progress.pending)}"
                first_type = next(iter(targets))
                for type_url in targets:
                    if any(short(type_url) in p for p in progress.pending):
                        first_type = type_url
                        break
                return PublishResult(
                    False, version, "ACK_TIMEOUT", first_type, detail, missing=tuple(progress.missing)
                )
            await self._streams.next_change(remaining)
