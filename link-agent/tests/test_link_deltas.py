"""The CP client on a delta stream: each delta applied to the last complete inventory and checked by its
hash; a gap, a mismatch or an unreadable delta answered by fetching the complete inventory."""

from __future__ import annotations

import json

import httpx
from google.protobuf import json_format
from stoa_link.cp_client import Backoff, Changed, CpClient
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_proto.inventory_delta import diff


def inventory(generation: int, *route_ids: str) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        schema_version=INVENTORY_SCHEMA_VERSION,
        gateway_id="gw",
        generation=generation,
        routes=[
            inventory_pb2.Route(route_id=r, api_id=r, tenant_id="t", upstream_url="http://127.0.0.1:9")
            for r in route_ids
        ],
    )


def as_json(message: object) -> str:
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None)  # type: ignore[arg-type]


def delta_event(old: inventory_pb2.Inventory, new: inventory_pb2.Inventory, *, corrupt: bool = False) -> str:
    delta = diff(old, new)
    if corrupt:
        delta.routes[0].upstream_url = "http://127.0.0.1:10"  # what the CP did not hash
    return f"event: delta\nid: {new.generation}\ndata: {as_json(delta)}\n\n"


async def follow(
    configs: list[inventory_pb2.Inventory], stream: str, count: int
) -> tuple[list[object], CpClient, int]:
    """The first `count` deliveries of a client whose CP answers /config with `configs` in turn and
    its event stream with `stream`; the (closed) client, and how many times /config was fetched."""
    answers = iter(configs)
    config_calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal config_calls
        if request.url.path == "/v1/gateways/gw/config":
            config_calls += 1
            return httpx.Response(200, text=as_json(next(answers)))
        assert request.url.params["deltas"] == "true"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream.encode())

    client = CpClient(
        "http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=Backoff(0.001, 0.002)
    )
    deliveries: list[object] = []
    async for delivery in client.deliveries():
        deliveries.append(delivery)
        if len(deliveries) == count:
            break
    await client.aclose()
    return deliveries, client, config_calls


async def test_deltas_apply_and_a_gap_a_mismatch_or_garbage_fetch_the_complete_inventory() -> None:
    v1, v2, v3 = inventory(1, "a"), inventory(2, "a", "b"), inventory(3, "b", "c")
    v4, v5, v6 = inventory(4, "c"), inventory(5, "c", "d"), inventory(6, "d")
    stream = (
        delta_event(v1, v2)  # applies
        + delta_event(v1, v2)  # the same again: nothing
        + delta_event(v2, v3, corrupt=True)  # another hash: GET /config (gives 3)
        + delta_event(v4, v5)  # base 4 while 3 is held: GET /config (gives 5)
        + "event: delta\nid: 6\ndata: {not json\n\n"  # unreadable: GET /config (gives 6)
    )

    deliveries, client, config_calls = await follow([v1, v3, v5, v6], stream, 5)
    # A delta applied comes as what changed with the complete inventory it gives; a fetch as that inventory.
    assert [type(d).__name__ for d in deliveries] == [
        "Inventory",
        "Changed",
        "Inventory",
        "Inventory",
        "Inventory",
    ]
    assert [d.inventory() if isinstance(d, Changed) else d for d in deliveries] == [v1, v2, v3, v5, v6]
    assert config_calls == 4
    assert client.refetches == {"mismatch": 1, "gap": 1, "unreadable": 1}
    assert client.last_event_id == 6


async def test_a_delta_that_is_json_but_no_delta_is_unreadable_and_fetches_the_complete_inventory() -> None:
    v1, v2 = inventory(1, "a"), inventory(2, "a", "b")
    header = {"schema_version": INVENTORY_SCHEMA_VERSION, "gateway_id": "gw", "generation": "2"}
    head = json.dumps({**header, "base_generation": "1"})[:-1]
    unreadable = [
        # Valid JSON, a string no protobuf string can hold (an unpaired surrogate).
        head + ', "routes": [{"route_id": "\\ud800"}]}',
        # Valid JSON nested deeper than any parser here follows.
        head + ', "routes": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ]
    stream = "".join(f"event: delta\nid: 2\ndata: {data}\n\n" for data in unreadable)
    deliveries, client, _ = await follow([v1, v2, v2], stream, 3)
    assert deliveries == [v1, v2, v2]
    assert client.refetches == {"unreadable": 2}
