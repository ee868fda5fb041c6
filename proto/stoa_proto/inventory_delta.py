"""The content hash of a complete inventory, and an InventoryDelta applied to one (the contract of the
SSE `delta` event: the CP computes both sides, the Link checks them).

The hash is order-free and additive: the sum (mod 2^256) of one SHA-256 per element (its kind and
its deterministic serialisation), hashed with the header (schema, gateway, generation). Whoever
holds the elements' digests updates it for a change in what the change costs, not in what the
inventory holds: the CP per event, the Link per applied delta.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from google.protobuf.message import Message

from stoa_proto import inventory_pb2

MODULUS = 1 << 256

# Each list of the inventory and the fields keying one of its elements: one field, or the tenant and
# one member (whose removal then names both, in a message of its own); none for a list of strings.
_KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "routes": ("route_id",),
    "policies": ("policy_id",),
    "tombstones": ("route_id",),
    "issuers": ("tenant_id", "issuer"),
    "tools": ("tenant_id", "name"),
    "consumers": ("tenant_id", "consumer_id"),
    "subscriptions": ("tenant_id", "subscription_id"),
    "revoked_key_sha256": (),  # each string is its own key
}
LISTS = tuple(_KEY_FIELDS)
_KEYS: dict[str, Callable[[Message], object]] = {
    name: attrgetter(*fields) if fields else (lambda element: element) for name, fields in _KEY_FIELDS.items()
}


def key_of(name: str, element: Message) -> object:
    return _KEYS[name](element)


def removed_keys(delta: inventory_pb2.InventoryDelta, name: str) -> Iterable[object]:
    """The keys of list `name` that `delta` records as gone."""
    removals = getattr(delta, f"removed_{name}")
    return [key_of(name, removal) for removal in removals] if len(_KEY_FIELDS[name]) > 1 else removals


def removed_key(delta: inventory_pb2.InventoryDelta, name: str, key: object) -> None:
    """Record in `delta` that the element of list `name` with `key` is gone."""
    removals = getattr(delta, f"removed_{name}")
    fields = _KEY_FIELDS[name]
    if len(fields) > 1:
        removals.add(**dict(zip(fields, key, strict=True)))  # type: ignore[call-overload]
    else:
        removals.append(key)


def tagged_digest(tag: str, body: bytes) -> int:
    """One element's share of an additive content hash (summed modulo MODULUS): SHA-256 of its tag
    (list name or resource type) and its bytes."""
    return int.from_bytes(hashlib.sha256(tag.encode() + b"\0" + body).digest(), "big")


def element_digest(name: str, element: Message | str) -> int:
    body = element.encode() if isinstance(element, str) else element.SerializeToString(deterministic=True)
    return tagged_digest(name, body)


def combine(schema_version: int, gateway_id: str, generation: int, total: int) -> str:
    """The hash of a complete inventory from its header and the sum of its elements' digests."""
    header = f"{schema_version}\n{gateway_id}\n{generation}\n".encode()
    return hashlib.sha256(header + total.to_bytes(32, "big")).hexdigest()


def inventory_hash(inventory: inventory_pb2.Inventory) -> str:
    """The content hash of `inventory` (computed whole; see `Elements` to keep it up to date)."""
    total = sum(element_digest(name, e) for name in LISTS for e in getattr(inventory, name)) % MODULUS
    return combine(inventory.schema_version, inventory.gateway_id, inventory.generation, total)


class DeltaMismatch(Exception):
    """A delta that does not apply (another base, a duplicate key) or does not reach its hash."""


@dataclass
class Elements:
    """A complete inventory as elements by key with their digests, and the sum of the digests."""

    schema_version: int = 0
    gateway_id: str = ""
    generation: int = 0
    lists: dict[str, dict[object, tuple[Message, int]]] = field(
        default_factory=lambda: {name: {} for name in LISTS}
    )
    total: int = 0

    @classmethod
    def of(cls, inventory: inventory_pb2.Inventory) -> Elements:
        held = cls(inventory.schema_version, inventory.gateway_id, inventory.generation)
        for name in LISTS:
            for element in getattr(inventory, name):
                held.put(name, element)
        return held

    def copy(self) -> Elements:
        """An independent copy (the elements are shared: nothing changes a message once held)."""
        return Elements(
            self.schema_version,
            self.gateway_id,
            self.generation,
            {name: dict(held) for name, held in self.lists.items()},
            self.total,
        )

    def put(self, name: str, element: Message) -> None:
        """Add `element`, replacing the one with its key."""
        self.remove(name, key_of(name, element))
        digest = element_digest(name, element)
        self.lists[name][key_of(name, element)] = (element, digest)
        self.total = (self.total + digest) % MODULUS

    def remove(self, name: str, key: object) -> bool:
        held = self.lists[name].pop(key, None)
        if held is None:
            return False
        self.total = (self.total - held[1]) % MODULUS
        return True

    def get(self, name: str, key: object) -> Message | None:
        held = self.lists[name].get(key)
        return None if held is None else held[0]

    def keys(self, name: str) -> Iterable[object]:
        return self.lists[name].keys()

    def hash(self) -> str:
        return combine(self.schema_version, self.gateway_id, self.generation, self.total)

    def inventory(self) -> inventory_pb2.Inventory:
        """The complete inventory, each list in key order (the order does not change the hash)."""
        lists: Mapping[str, list[Message]] = {
            name: [held[key][0] for key in sorted(held)]  # type: ignore[type-var]
            for name, held in self.lists.items()
        }
        return inventory_pb2.Inventory(
            schema_version=self.schema_version,
            gateway_id=self.gateway_id,
            generation=self.generation,
            **lists,  # type: ignore[arg-type]
        )

    def apply(self, delta: inventory_pb2.InventoryDelta) -> None:
        """Apply `delta` in place; raises DeltaMismatch (the caller then discards this state) when it
        is for another base or gateway, or the result's hash is not the delta's."""
        if delta.gateway_id != self.gateway_id or delta.base_generation != self.generation:
            raise DeltaMismatch(
                f"delta {delta.base_generation}→{delta.generation} of gateway {delta.gateway_id!r} does not "
                f"apply to generation {self.generation} of {self.gateway_id!r}"
            )
        for name in LISTS:
            for key in removed_keys(delta, name):
                self.remove(name, key)
            for element in getattr(delta, name):
                self.put(name, element)
        self.schema_version, self.generation = delta.schema_version, delta.generation
        reached = self.hash()
        if reached != delta.inventory_hash:
            raise DeltaMismatch(
                f"generation {delta.generation}: the applied delta hashes to {reached}, "
                f"the CP's inventory to {delta.inventory_hash}"
            )


def diff(old: inventory_pb2.Inventory, new: inventory_pb2.Inventory) -> inventory_pb2.InventoryDelta:
    """The delta from `old` to `new` (tests, tools; the CP computes its deltas from what changed)."""
    before, after = Elements.of(old), Elements.of(new)
    delta = inventory_pb2.InventoryDelta(
        schema_version=new.schema_version,
        gateway_id=new.gateway_id,
        generation=new.generation,
        base_generation=old.generation,
        inventory_hash=after.hash(),
    )
    for name in LISTS:
        for key, (element, digest) in sorted(after.lists[name].items()):  # type: ignore[type-var]
            held = before.lists[name].get(key)
            if held is None or held[1] != digest:
                getattr(delta, name).append(element)
        for key in sorted(set(before.keys(name)) - set(after.keys(name))):  # type: ignore[type-var]
            removed_key(delta, name, key)
    return delta
