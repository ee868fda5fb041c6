"""The inventory guard: what the Link refuses before translating anything.

Pure checks, in this order: another gateway's inventory, a generation not above
the last applied one, a route lost without a tombstone. A refusal is reported FAILED and nothing of
the refused inventory is published.
"""

from __future__ import annotations

from stoa_proto import inventory_pb2
from stoa_translate.refusal import FailureReason, Refusal

__all__ = ["FailureReason", "Refusal", "check"]


def check(
    inventory: inventory_pb2.Inventory,
    last_applied: inventory_pb2.Inventory | None,
    gateway_id: str,
) -> None:
    """Raise `Refusal` when `inventory` must not replace `last_applied` on gateway `gateway_id`."""
    if inventory.gateway_id != gateway_id:
        raise Refusal(
            FailureReason.FOREIGN_GATEWAY,
            f"inventory is for gateway {inventory.gateway_id!r}, this Link serves {gateway_id!r}",
        )
    # Generations start at 1, so with nothing applied yet the floor is 0.
    floor = last_applied.generation if last_applied is not None else 0
    if inventory.generation <= floor:
        raise Refusal(
            FailureReason.STALE_GENERATION,
            f"generation {inventory.generation} is not above the last applied generation {floor}",
        )
    if last_applied is None:
        return
    kept = {route.route_id for route in inventory.routes}
    tombstoned = {tombstone.route_id for tombstone in inventory.tombstones}
    lost = sorted({route.route_id for route in last_applied.routes} - kept - tombstoned)
    if lost:
        raise Refusal(
            FailureReason.ROUTE_LOSS,
            f"routes missing without a tombstone: {', '.join(lost)}",
        )
