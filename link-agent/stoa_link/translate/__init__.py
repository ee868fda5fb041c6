"""The translator: inventory → IR → Envoy resources and the site policy sets, as one Snapshot.

Pure: the same inventory and options always give the same snapshot. Stages: `ir.build` (validate and
resolve; every refusal happens there), then `policy_set`, `clusters`, `listener`, `routes`.
"""

from __future__ import annotations

from stoa_proto import inventory_pb2

from stoa_link.snapshot import AUTHZ_POLICY_SET, CLUSTER, LISTENER, ROUTE, Snapshot
from stoa_link.translate import ir
from stoa_link.translate.clusters import render_clusters
from stoa_link.translate.listener import render_listener
from stoa_link.translate.options import TranslateOptions
from stoa_link.translate.policy_set import render_policy_set
from stoa_link.translate.routes import render_routes

__all__ = ["TranslateOptions", "translate"]


def translate(inventory: inventory_pb2.Inventory, options: TranslateOptions) -> Snapshot:
    """Render `inventory`; raises `stoa_link.guard.Refusal` when it cannot be expressed safely."""
    site = ir.build(inventory)
    # The routes carry the policy-set version, so the set is rendered first.
    policy_set = render_policy_set(site)
    return Snapshot.build(
        inventory.gateway_id,
        inventory.generation,
        {
            CLUSTER: render_clusters(site, options),
            LISTENER: [render_listener(site, options)],
            ROUTE: [render_routes(site, options, policy_set.version)],
            AUTHZ_POLICY_SET: [policy_set],
        },
    )
