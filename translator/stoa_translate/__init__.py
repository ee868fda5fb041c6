"""The translator: inventory → IR → Envoy resources and the site policy sets, as one Snapshot.

Shared by the Link (what it publishes) and the CP (what it previews, and the rules it checks writes
against), so both give the same answer for the same inventory and options. Stages: `ir.build`
(validate and resolve; every refusal about content happens there), then `policy_set`, `clusters`,
`listener`, `routes`, and a consistency check of the references between the rendered resources.
"""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2
from google.protobuf.message import Message
from stoa_proto import inventory_pb2
from stoa_proto.inventory_delta import Elements

from stoa_translate import ir
from stoa_translate.changes import Kept
from stoa_translate.clusters import render_clusters
from stoa_translate.decision.placement import placed
from stoa_translate.listener import render_listener
from stoa_translate.options import TranslateOptions
from stoa_translate.policy_set import render_mcp_policy_set, render_policy_set, render_proc_policy_set
from stoa_translate.refusal import FailureReason, Refusal
from stoa_translate.routes import KeptTables, render_routes
from stoa_translate.snapshot import (
    AUTHZ_POLICY_SET,
    CLUSTER,
    LISTENER,
    MCP_POLICY_SET,
    PROC_POLICY_SET,
    ROUTE,
    SCOPED_ROUTE,
    Snapshot,
    clusters_named,
    dangling_references,
)

__all__ = ["TranslateOptions", "Translator", "translate"]


class Translator:
    """Translates inventories for one set of options, remembering its latest translation.

    Pure in effect: the same inventory always gives the same snapshot. What it keeps (each route's
    resolved IR by content, each route's rendered entries) only makes the next translation cost what
    changed; it lives as long as its owner (the Link's agent: the Link's life; a CP preview: one
    request) and holds only the latest translation's routes.
    """

    def __init__(self, options: TranslateOptions) -> None:
        self.options = options
        self._resolved: dict[bytes, ir.RouteIR] = {}
        self._rendered: dict[ir.RouteIR, bytes] = {}
        # A route's rendered entries → the clusters they name (for the consistency check).
        self._clusters_named: dict[bytes, frozenset[str]] = {}
        self._tables: KeptTables = {}
        # The routes whose prefix kept the last translation on one route table though scopes were
        # asked for (reported by the Link).
        self.unkeyed: tuple[str, ...] = ()
        # The latest translation, whose serialised resources the next one reuses where unchanged.
        self._latest: Snapshot | None = None
        # What a change applies to: the latest full translation (its site, its processing set's
        # version, its inventory), indexed by `Kept` when the first change comes.
        self._full: tuple[ir.SiteIR, str | None, inventory_pb2.Inventory] | None = None
        self._kept: Kept | None = None

    def translate(self, inventory: inventory_pb2.Inventory) -> Snapshot:
        """Render `inventory`; raises `stoa_translate.refusal.Refusal` when it cannot be expressed safely."""
        site, resolved = ir.build(inventory, self._resolved)
        site = placed(site, self.options)
        snapshot, rendered, named, tables = self._render(site, self._latest)
        self._resolved, self._rendered, self._clusters_named, self._tables = resolved, rendered, named, tables
        self._latest = snapshot
        proc = snapshot.of(PROC_POLICY_SET)[0]
        self._full = (site, proc.version if site.needs_processing() else None, inventory)  # type: ignore[attr-defined]
        self._kept = None
        return snapshot

    def prepare_changes(self) -> None:
        """Index the latest full translation for the changes to come (done by the first change
        otherwise: a caller with idle time spends it here instead)."""
        if self._kept is None and self._full is not None and self._latest is not None:
            site, proc_version, inventory = self._full
            self._kept = Kept.of(site, self.options, proc_version, self._rendered, inventory, self._latest)

    def translate_change(
        self, state: Elements, delta: inventory_pb2.InventoryDelta, base_is_latest: bool
    ) -> Snapshot:
        """Render `state`, the complete inventory `delta` gives. `base_is_latest`: the caller vouches
        that this translator's latest translation was of the inventory `delta` applies to; then a
        change of routes (`stoa_translate.changes`) costs those routes. Anything else, or without that
        word, is a translation of the complete inventory. Same result, same refusals, either way."""
        self.prepare_changes()
        kept, self._kept = self._kept, None
        if base_is_latest and self._latest is not None:
            snapshot = None if kept is None else kept.apply(delta, state, self._resolved, self._rendered)
            if snapshot is not None and kept is not None:
                # The full translation's site is behind now: only `kept` follows the changes.
                self._kept, self._latest, self._full = kept, snapshot, None
                self.unkeyed = tuple(sorted(kept.unkeyed)) if self.options.route_scopes else ()
                return snapshot
        return self.translate(state.inventory())

    def resolve(self, inventory: inventory_pb2.Inventory) -> ir.SiteIR:
        """The first stage alone: the inventory's IR as `render` takes it (refusals as in `translate`)."""
        return placed(ir.build(inventory, {})[0], self.options)

    def render(self, site: ir.SiteIR) -> Snapshot:
        """The second stage alone: an IR (from `resolve`) to the snapshot, checked for consistency."""
        return self._render(site)[0]

    def _render(
        self, site: ir.SiteIR, previous: Snapshot | None = None
    ) -> tuple[Snapshot, dict[ir.RouteIR, bytes], dict[bytes, frozenset[str]], KeptTables]:
        policy_set = render_policy_set(site)
        # The virtual host names the processing set's version, so that set is rendered first.
        proc_set = render_proc_policy_set(site)
        proc_version = proc_set.version if site.needs_processing() else None
        routes, rendered, tables = render_routes(
            site, self.options, proc_version, self._rendered, self._tables
        )
        self.unkeyed = routes.unkeyed
        envoy: dict[str, list[Message]] = {
            CLUSTER: list(render_clusters(site, self.options)),
            LISTENER: [render_listener(site, self.options)],
            ROUTE: list(routes.tables),
        }
        if routes.scopes:
            envoy[SCOPED_ROUTE] = list(routes.scopes)
        snapshot = Snapshot.build(
            site.gateway_id,
            site.generation,
            {
                **envoy,
                AUTHZ_POLICY_SET: policy_set,
                PROC_POLICY_SET: [proc_set],
                MCP_POLICY_SET: [render_mcp_policy_set(site)],
            },
            previous,
        )
        named = {
            body: self._clusters_named.get(body)
            or frozenset(clusters_named(route_components_pb2.VirtualHost.FromString(body).routes))
            for body in rendered.values()
        }
        dangling = dangling_references(snapshot, frozenset().union(*named.values()))
        if dangling:
            raise Refusal(FailureReason.INCONSISTENT_SNAPSHOT, "; ".join(dangling))
        return snapshot, rendered, named, tables


def translate(inventory: inventory_pb2.Inventory, options: TranslateOptions) -> Snapshot:
    """One translation with nothing remembered (tests, one-off renders)."""
    return Translator(options).translate(inventory)
