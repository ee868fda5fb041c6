"""The guard's refusals, table-driven: foreign gateway, stale generation, route loss."""

from __future__ import annotations

import pytest
from stoa_link.guard import FailureReason, Refusal, check
from stoa_proto import inventory_pb2


def inventory(
    generation: int, routes: tuple[str, ...] = (), tombstones: tuple[str, ...] = (), gateway_id: str = "gw-1"
) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        gateway_id=gateway_id,
        generation=generation,
        routes=[inventory_pb2.Route(route_id=r) for r in routes],
        tombstones=[inventory_pb2.Tombstone(route_id=t, generation=generation) for t in tombstones],
    )


ACCEPTED = [
    ("first inventory", inventory(1, ("a",)), None),
    ("first inventory, empty", inventory(1), None),
    ("next generation, same routes", inventory(3, ("a", "b")), inventory(2, ("a", "b"))),
    ("generation jump", inventory(10, ("a",)), inventory(2, ("a",))),
    ("route added", inventory(3, ("a", "b", "c")), inventory(2, ("a", "b"))),
    ("route removed with its tombstone", inventory(3, ("a",), ("b",)), inventory(2, ("a", "b"))),
    ("every route tombstoned", inventory(3, (), ("a", "b")), inventory(2, ("a", "b"))),
    ("old tombstone kept", inventory(4, ("a",), ("b",)), inventory(3, ("a",), ("b",))),
    ("re-deploy of a tombstoned route", inventory(4, ("a", "b")), inventory(3, ("a",), ("b",))),
]


@pytest.mark.parametrize(("new", "last"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted(new: inventory_pb2.Inventory, last: inventory_pb2.Inventory | None) -> None:
    check(new, last, "gw-1")


REFUSED = [
    (
        "another gateway's inventory",
        inventory(5, ("a",), gateway_id="gw-2"),
        inventory(4, ("a",)),
        FailureReason.FOREIGN_GATEWAY,
        ["gw-2", "gw-1"],
    ),
    (
        "another gateway's, nothing applied yet",
        inventory(1, gateway_id="gw-2"),
        None,
        FailureReason.FOREIGN_GATEWAY,
        ["gw-2"],
    ),
    ("same generation", inventory(4, ("a",)), inventory(4, ("a",)), FailureReason.STALE_GENERATION, ["4"]),
    (
        "older generation",
        inventory(3, ("a",)),
        inventory(4, ("a",)),
        FailureReason.STALE_GENERATION,
        ["3", "4"],
    ),
    ("generation zero", inventory(0, ("a",)), None, FailureReason.STALE_GENERATION, ["0"]),
    (
        "route dropped without tombstone",
        inventory(5, ("a",)),
        inventory(4, ("a", "b")),
        FailureReason.ROUTE_LOSS,
        ["b"],
    ),
    (
        "empty inventory never empties",
        inventory(5),
        inventory(4, ("a", "b")),
        FailureReason.ROUTE_LOSS,
        ["a, b"],
    ),
    (
        "tombstone for another route does not count",
        inventory(5, ("a",), ("c",)),
        inventory(4, ("a", "b")),
        FailureReason.ROUTE_LOSS,
        ["b"],
    ),
    (
        "foreign wins over stale",
        inventory(1, gateway_id="gw-2"),
        inventory(4, ("a",)),
        FailureReason.FOREIGN_GATEWAY,
        ["gw-2"],
    ),
    (
        "stale wins over route loss",
        inventory(3),
        inventory(4, ("a",)),
        FailureReason.STALE_GENERATION,
        ["3"],
    ),
]


@pytest.mark.parametrize(
    ("new", "last", "reason", "named"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused(
    new: inventory_pb2.Inventory,
    last: inventory_pb2.Inventory | None,
    reason: int,
    named: list[str],
) -> None:
    with pytest.raises(Refusal) as caught:
        check(new, last, "gw-1")
    assert caught.value.reason == reason
    for text in named:
        assert text in caught.value.detail
    assert FailureReason.Name(reason) in str(caught.value)
