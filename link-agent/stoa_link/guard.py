"""The inventory guard: what the Link refuses before translating anything.

Pure checks, in this order: another gateway's inventory, a generation not above
the last applied one, a route lost without a tombstone. A refusal is reported FAILED and nothing of
the refused inventory is published.
"""

from __future__ import annotations

from stoa_proto import inventory_pb2
from stoa_proto.inventory_delta import Elements
from stoa_translate.refusal import FailureReason, Refusal

__all__ = ["FailureReason", "Refusal", "check", "check_change"]


def _foreign_or_stale(of_gateway: str, generation: int, floor: int, gateway_id: str) -> None:
    if of_gateway != gateway_id:
        raise Refusal(
            FailureReason.FOREIGN_GATEWAY,
            f"inventory is for gateway {of_gateway!r}, this Link serves {gateway_id!r}",
        )
    if generation <= floor:
        raise Refusal(
            FailureReason.STALE_GENERATION,
            f"generation {generation} is not above the last applied generation {floor}",
        )


def check(
    inventory: inventory_pb2.Inventory,
    last_applied: inventory_pb2.Inventory | None,
    gateway_id: str,
) -> None:
    """Raise `Refusal` when `inventory` must not replace `last_applied` on gateway `gateway_id`."""
    # Generations start at 1, so with nothing applied yet the floor is 0.
    floor = last_applied.generation if last_applied is not None else 0
    _foreign_or_stale(inventory.gateway_id, inventory.generation, floor, gateway_id)
    if last_applied is None:
        return
    kept = {route.route_id for route in inventory.routes}
    tombstoned = {tombstone.route_id for tombstone in inventory.tombstones}
    _no_loss({route.route_id for route in last_applied.routes} - kept - tombstoned)


def check_change(
    delta: inventory_pb2.InventoryDelta, inventory: Elements, last_applied: Elements | None, gateway_id: str
) -> None:
    """`check` for `inventory`, the complete inventory `delta` gives applied to `last_applied`: the
    same rules, looked up for what the delta names (a route is lost only by being removed)."""
    _foreign_or_stale(
        inventory.gateway_id, inventory.generation, last_applied.generation if last_applied else 0, gateway_id
    )
    if last_applied is None:
        return
    _no_loss(
        {
            route_id
            for route_id in delta.removed_routes
            if last_applied.get("routes", route_id) is not None
            and inventory.get("routes", route_id) is None
            and inventory.get("tombstones", route_id) is None
        }
    )


def _no_loss(lost: set[str]) -> None:
    if lost:
        raise Refusal(
            FailureReason.ROUTE_LOSS,
            f"routes missing without a tombstone: {', '.join(sorted(lost))}",
        )
