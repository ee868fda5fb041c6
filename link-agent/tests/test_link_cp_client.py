"""The CP client: config fetch, SSE follow, resume with Last-Event-ID, bounded jittered backoff."""

from __future__ import annotations

import json

import httpx
import pytest
from google.protobuf import json_format
from stoa_link.cp_client import CpClient, InvalidInventory, parse_inventory
from stoa_ops.backoff import Backoff
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_translate import TranslateOptions, translate
from stoa_translate.refusal import FailureReason, Refusal


def inventory_json(generation: int) -> str:
    inv = inventory_pb2.Inventory(
        schema_version=INVENTORY_SCHEMA_VERSION, gateway_id="gw", generation=generation
    )
    return json_format.MessageToJson(inv, preserving_proto_field_name=True, indent=None)


def sse(*generations: int, data: str | None = None) -> bytes:
    out = ": keep-alive\n\n"
    for g in generations:
        out += f"event: inventory\nid: {g}\ndata: {data or inventory_json(g)}\n\n"
    return out.encode()


def fast() -> Backoff:
    return Backoff(base_s=0.001, cap_s=0.002)


async def take(client: CpClient, count: int) -> list:
    out = []
    async for delivery in client.deliveries():
        out.append(delivery)
        if len(out) == count:
            break
    return out


async def test_fetches_config_then_follows_and_resumes_after_each_break() -> None:
    seen_ids: list[str | None] = []
    streams = iter([sse(2, 3), None, sse(4)])

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer secret"
        if request.url.path == "/v1/gateways/gw/config":
            return httpx.Response(200, text=inventory_json(1))
        assert request.url.path == "/v1/gateways/gw/events"
        seen_ids.append(request.headers.get("last-event-id"))
        body = next(streams)
        if body is None:
            return httpx.Response(503, text="down")
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = CpClient("http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=fast())
    deliveries = await take(client, 4)
    await client.aclose()
    assert [d.generation for d in deliveries] == [1, 2, 3, 4]
    # Resumed from the last generation seen, never from the start.
    assert seen_ids == ["1", "3", "3"]


@pytest.mark.parametrize(("options", "query"), [({}, "deltas=true"), ({"deltas": False}, "")])
async def test_the_event_stream_is_followed_as_deltas_unless_turned_off(options: dict, query: str) -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/config"):
            return httpx.Response(200, text=inventory_json(1))
        asked.append(request.url.query.decode())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=sse(2))

    client = CpClient(
        "http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=fast(), **options
    )
    assert [d.generation for d in await take(client, 2)] == [1, 2]
    await client.aclose()
    assert asked == [query]


async def test_config_outage_is_retried_until_the_cp_answers() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise httpx.ConnectError("refused", request=request)
        if calls == 3:
            return httpx.Response(500)
        return httpx.Response(200, text=inventory_json(7))

    client = CpClient("http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=fast())
    [first] = await take(client, 1)
    await client.aclose()
    assert first.generation == 7
    assert calls == 4


async def test_an_event_that_is_not_an_inventory_is_delivered_as_invalid() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/config"):
            return httpx.Response(200, text=inventory_json(1))
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=sse(5, data='{"schema_version": 2, "generation": "5", "routes": "nope"}'),
        )

    client = CpClient("http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=fast())
    _, bad = await take(client, 2)
    await client.aclose()
    assert isinstance(bad, InvalidInventory)
    assert bad.generation == 5
    assert "routes" in bad.detail


def _route(route_id: str, **fields: object) -> dict[str, object]:
    return {
        "route_id": route_id,
        "tenant_id": "t",
        "api_id": route_id,
        "path_prefix": f"/apis/{route_id}",
        "methods": ["GET"],
        "upstream_url": "http://127.0.0.1:9000",
        "timeout_ms": 0,
        "auth_mode": "jwt",
        "scopes": [],
        **fields,
    }


@pytest.mark.parametrize(
    "routes",
    [
        [_route("a"), _route("b", timeout_ms=4294967295, scopes=["x"], methods=[])],
        [_route("a", timeout_ms="15"), _route("b")],  # a number written as a string
        [{"routeId": "a", "tenantId": "t", "timeoutMs": 1.0}],  # camelCase names, a float
        [_route("a", scopes=None), {"route_id": "b"}],  # null, and fields left out
    ],
    ids=["plain", "string-number", "camel-case", "null-and-sparse"],
)
def test_parse_equals_json_format_however_the_document_is_written(routes: list) -> None:
    tombstones = [{"route_id": "x", "generation": "9007199254740993"}, {"route_id": "y", "generation": 3}]
    for generation in (1, 2):  # the second parse reuses what the first one parsed
        doc = {
            "schema_version": 2,
            "gateway_id": "gw",
            "generation": str(generation),
            "routes": routes,
            "tombstones": tombstones,
        }
        text = json.dumps(doc)
        assert parse_inventory(text) == json_format.Parse(text, inventory_pb2.Inventory())


@pytest.mark.parametrize(
    "route",
    [
        _route("a", timeout_ms=-1),
        _route("a", timeout_ms=2**32),
        _route("a", methods="GET"),
        _route("a", colour="red"),
        {**_route("a"), "route_id": 7},
    ],
    ids=["negative", "too-large", "not-a-list", "unknown-field", "number-for-string"],
)
def test_a_route_json_format_refuses_is_refused(route: dict) -> None:
    text = json.dumps(
        {"schema_version": 2, "gateway_id": "gw", "generation": "5", "routes": [_route("ok"), route]}
    )
    delivery = parse_inventory(text, generation_hint=5)
    assert isinstance(delivery, InvalidInventory)
    assert delivery.generation == 5
    assert "not valid proto3 JSON" in delivery.detail


@pytest.mark.parametrize(
    ("document", "named"),
    [
        # What a CP from before typed policy configs writes: no schema_version, an untyped config.
        (
            '{"gateway_id": "gw", "generation": "4", "policies": [{"policy_id": "c", "type": "cors",'
            ' "config": {"allowedOrigins": ["*"]}}]}',
            "inventory schema_version absent (schema 1) is not a schema this Link reads (it reads 2)",
        ),
        ('{"schema_version": 3, "gateway_id": "gw", "generation": "4"}', "schema_version 3 is not a schema"),
    ],
)
def test_an_inventory_of_another_schema_is_refused_saying_so(document: str, named: str) -> None:
    delivery = parse_inventory(document)
    assert isinstance(delivery, InvalidInventory)
    assert delivery.generation == 4
    assert named in delivery.detail


def test_a_policy_of_a_kind_this_link_does_not_know_reaches_the_translator_named() -> None:
    # A newer CP's kind has a type and no member this Link knows of: the translator refuses it by name.
    document = json.dumps(
        {
            "schema_version": INVENTORY_SCHEMA_VERSION,
            "gateway_id": "gw",
            "generation": "5",
            "policies": [{"policy_id": "p1", "type": "oidc", "oidc": {"issuer": "x"}, "applicable": []}],
        }
    )
    delivery = parse_inventory(document)
    assert isinstance(delivery, inventory_pb2.Inventory)
    assert delivery.policies[0].type == "oidc"
    with pytest.raises(Refusal) as caught:
        translate(delivery, TranslateOptions())
    assert caught.value.reason == FailureReason.UNSUPPORTED_POLICY
    assert caught.value.detail == "policy p1: type oidc is not supported"
