"""The inventory's content hash and deltas: order-free, updated per element, and a delta applies only
to its base and reaches only its own hash."""

from __future__ import annotations

import pytest
from stoa_proto import inventory_pb2
from stoa_proto.inventory_delta import LISTS, DeltaMismatch, Elements, diff, inventory_hash


def inventory(
    generation: int, routes: dict[str, str], policies: tuple[str, ...] = ()
) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        schema_version=2,
        gateway_id="gw",
        generation=generation,
        routes=[inventory_pb2.Route(route_id=r, api_id=r, upstream_url=u) for r, u in routes.items()],
        policies=[inventory_pb2.Policy(policy_id=p, type="cors", applicable=list(routes)) for p in policies],
        issuers=[inventory_pb2.TrustedIssuer(tenant_id="t", issuer="https://i", jwks_json="{}")],
    )


def test_the_hash_ignores_order_and_sees_every_element_and_the_generation() -> None:
    base = inventory(3, {"a": "http://x", "b": "http://y"}, ("p",))
    reordered = inventory_pb2.Inventory()
    reordered.CopyFrom(base)
    reordered.routes.reverse()
    assert inventory_hash(reordered) == inventory_hash(base) == Elements.of(base).hash()
    assert inventory_hash(inventory(3, {"a": "http://x", "b": "http://z"}, ("p",))) != inventory_hash(base)
    assert inventory_hash(inventory(4, {"a": "http://x", "b": "http://y"}, ("p",))) != inventory_hash(base)
    assert inventory_hash(inventory(3, {"a": "http://x"}, ("p",))) != inventory_hash(base)


def test_a_delta_rebuilds_the_new_inventory_and_refuses_another_base_or_hash() -> None:
    old = inventory(1, {"a": "http://x", "b": "http://y"}, ("p",))
    new = inventory(2, {"b": "http://y2", "c": "http://z"}, ("p",))
    new.tombstones.add(route_id="a", generation=2)
    del new.issuers[:]
    delta = diff(old, new)
    assert sorted(r.route_id for r in delta.routes) == ["b", "c"]
    assert list(delta.removed_routes) == ["a"]
    assert [(i.tenant_id, i.issuer) for i in delta.removed_issuers] == [("t", "https://i")]

    held = Elements.of(old)
    held.apply(delta)
    assert held.inventory() == Elements.of(new).inventory()

    with pytest.raises(DeltaMismatch, match="does not apply"):
        Elements.of(new).apply(delta)  # its base is 1
    tampered = inventory_pb2.InventoryDelta()
    tampered.CopyFrom(delta)
    tampered.routes[0].upstream_url = "http://elsewhere"
    with pytest.raises(DeltaMismatch, match="hashes to"):
        Elements.of(old).apply(tampered)


@pytest.mark.parametrize("name", LISTS)
def test_a_delta_removing_every_element_of_one_list_rebuilds_the_new_inventory(name: str) -> None:
    old = inventory(1, {"a": "http://x"}, ("p",))
    old.tombstones.add(route_id="gone", generation=1)
    old.tools.add(tenant_id="t", name="get_order")
    old.consumers.add(tenant_id="t", consumer_id="c1")
    old.subscriptions.add(tenant_id="t", subscription_id="s1", consumer_id="c1")
    old.revoked_key_sha256.append("aa" * 32)
    new = inventory_pb2.Inventory()
    new.CopyFrom(old)
    new.generation = 2
    new.ClearField(name)
    delta = diff(old, new)
    assert len(getattr(delta, f"removed_{name}")) == 1
    held = Elements.of(old)
    held.apply(delta)
    assert held.inventory() == Elements.of(new).inventory()
