"""The Link's view of the CP: the config endpoint, then the SSE stream of deltas, resumed by generation.

Each delta applies to the last complete inventory received; the result must have the delta's content
hash. A delta for another generation (a gap), one that misses its hash, or one that cannot be read
makes the Link fetch the complete inventory instead, so what the agent gets is always complete.

The Link always connects out. During an outage nothing here touches what the ADS server serves; the
client reconnects with bounded, fully jittered exponential backoff and resumes with Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from httpx_sse import aconnect_sse
from stoa_ops.backoff import Backoff
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_proto.inventory_delta import DeltaMismatch, Elements
from stoa_translate.policies import KINDS

log = logging.getLogger("stoa_link.cp_client")


@dataclass(frozen=True)
class InvalidInventory:
    """A delivery that is not a valid Inventory document: reported FAILED, never applied."""

    generation: int
    detail: str


@dataclass(frozen=True)
class ToolPermissions:
    """The gateway's signed tool permissions as the CP sent them (relayed to the MCP module as is:
    the module, not the Link, verifies them)."""

    seq: int
    jws: str


@dataclass(frozen=True)
class Changed:
    """A delta event applied to the complete inventory the Link held: the delta, the complete inventory
    it gives (checked against the delta's hash; a copy, so later deltas leave it as it is), and the hash
    of the inventory it applied to. What the agent applies, guards and translates by what changed when
    it holds that base; else it takes the complete inventory."""

    delta: inventory_pb2.InventoryDelta
    state: Elements
    base_hash: str

    @property
    def generation(self) -> int:
        return self.delta.generation

    @property
    def gateway_id(self) -> str:
        return self.delta.gateway_id

    def inventory(self) -> inventory_pb2.Inventory:
        return self.state.inventory()


Delivery = inventory_pb2.Inventory | Changed | InvalidInventory


# repr of one element of a large list (see _ELEMENTS; as JSON-decoded) → the serialised Inventory
# holding just that element, from the latest document: json_format parses ≈40 µs per route in Python,
# so a document that changes one route among 10,000 is parsed element by element and only new
# elements pay it.
_fragments: dict[str, bytes] = {}


def _field_kinds(message: type[Message]) -> dict[str, str]:
    kinds = {}
    for f in message.DESCRIPTOR.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            kinds[f.name] = "strings" if f.is_repeated else "string"
        elif not f.is_repeated and f.type == FieldDescriptor.TYPE_UINT32:
            kinds[f.name] = "uint32"
        elif not f.is_repeated and f.type == FieldDescriptor.TYPE_INT64:
            kinds[f.name] = "int64"
    return kinds


# The lists that grow with the estate (10,000 routes, as many tombstones after a mass undeployment):
# element message of each, and the kind of each of its fields the plain path handles.
_ELEMENTS: dict[str, tuple[type[Message], dict[str, str]]] = {
    "routes": (inventory_pb2.Route, _field_kinds(inventory_pb2.Route)),
    "tombstones": (inventory_pb2.Tombstone, _field_kinds(inventory_pb2.Tombstone)),
}
_INT64 = re.compile(r"-?[0-9]{1,19}")
# Top-level members read before parsing (the CP writes both near the start of the document; a member
# of that name nested deeper does not exist in the contract).
_SCHEMA_VERSION = re.compile(r'"(?:schema_version|schemaVersion)"\s*:\s*"?([0-9]{1,9})"?')
_GENERATION = re.compile(r'"generation"\s*:\s*"?([0-9]{1,18})"?')
_NOT_PLAIN = object()


def _int64(value: Any) -> Any:
    if type(value) is str and _INT64.fullmatch(value) and -(2**63) <= int(value) < 2**63:
        return int(value)
    return _NOT_PLAIN


# Each kind: the value as the message field takes it, or _NOT_PLAIN.
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "string": lambda v: v if type(v) is str else _NOT_PLAIN,
    "strings": lambda v: v if type(v) is list and all(type(x) is str for x in v) else _NOT_PLAIN,
    "uint32": lambda v: v if type(v) is int and 0 <= v < 2**32 else _NOT_PLAIN,
    "int64": _int64,
}


def _plain(name: str, item: Any) -> Message | None:
    """`item` as its message when it is written the way the CP writes it: snake_case keys and values
    of exactly the JSON types proto3 JSON uses for them (int64 as a decimal string). What
    `json_format.ParseDict` gives for those, at C speed (≈20 µs → 3 µs a route); None for anything
    else (camelCase keys, numbers as strings, nulls…), which then goes through ParseDict."""
    message, kinds = _ELEMENTS[name]
    if type(item) is not dict:
        return None
    values: dict[str, Any] = {}
    for key, value in item.items():
        kind = kinds.get(key)
        converted = _NOT_PLAIN if kind is None else _CONVERT[kind](value)
        if converted is _NOT_PLAIN:
            return None
        values[key] = converted
    return message(**values)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return obj


def _parse_reusing(text: str) -> inventory_pb2.Inventory:
    """`json_format.Parse`, element by element for the large lists, with parsed elements reused.

    Every element goes through `json_format.ParseDict` (or was, with the same value, in the previous
    document), and serialised messages concatenate into their merge with repeated fields appended in
    order, so the result equals parsing the whole document. Raises on anything unusual; the caller
    then parses the document as a whole, for its verdict and its error message.
    """
    doc = json.loads(text, object_pairs_hook=_unique_keys)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    parts: list[bytes] = []
    fragments: dict[str, bytes] = {}
    for name in _ELEMENTS:
        items = doc.pop(name, None)
        if items is None:
            continue
        if not isinstance(items, list):
            raise ValueError(f"{name} is not a list")
        keys = [repr(item) for item in items]
        new = {key: item for key, item in zip(keys, items, strict=True) if key not in _fragments}
        parsed = {key: _plain(name, item) for key, item in new.items()}
        unusual = {key: new[key] for key, message in parsed.items() if message is None}
        if unusual:
            # One ParseDict call for every element the plain path left, then one fragment each.
            batch = json_format.ParseDict({name: list(unusual.values())}, inventory_pb2.Inventory())
            parsed.update(zip(unusual, getattr(batch, name), strict=True))
        for key, message in parsed.items():
            fragments[key] = inventory_pb2.Inventory(**{name: [message]}).SerializeToString()
        for key in keys:
            fragment = fragments.get(key) or _fragments[key]
            fragments[key] = fragment
            parts.append(fragment)
    parts.append(json_format.ParseDict(doc, inventory_pb2.Inventory()).SerializeToString())
    _fragments.clear()
    _fragments.update(fragments)
    return inventory_pb2.Inventory.FromString(b"".join(parts))


def parse_delta(text: str) -> inventory_pb2.InventoryDelta:
    """`json_format.Parse` of a delta event, its routes and tombstones built at C speed where written
    the way the CP writes them (as in `_parse_reusing`): a full publication is a delta of 10,000 routes.
    Raises `json_format.ParseError` for what is not a delta: valid JSON may still be no delta (a string
    no protobuf string holds, a nesting too deep), and anything else escaping here would end the Link's
    stream of the CP's events, not fetch the complete inventory."""
    try:
        return _parse_delta(text)
    except json_format.ParseError:
        raise
    except Exception as exc:  # the whole-document parse below gives the verdict and its message
        log.debug("delta_parse_fallback", extra={"fields": {"error": repr(exc)[:300]}})
    return json_format.Parse(text, inventory_pb2.InventoryDelta())


def _parse_delta(text: str) -> inventory_pb2.InventoryDelta:
    doc = json.loads(text, object_pairs_hook=_unique_keys)
    if not isinstance(doc, dict):
        return json_format.Parse(text, inventory_pb2.InventoryDelta())
    plain: dict[str, list[Message]] = {}
    for name in _ELEMENTS:
        items = doc.get(name)
        if isinstance(items, list):
            messages = [_plain(name, item) for item in items]
            if all(m is not None for m in messages):
                plain[name] = messages  # type: ignore[assignment]
                del doc[name]
    delta = json_format.ParseDict(doc, inventory_pb2.InventoryDelta())
    for name, messages in plain.items():
        getattr(delta, name).extend(messages)
    return delta


def schema_refusal(text: str, generation_hint: int) -> InvalidInventory | None:
    """A refusal naming the document's schema when it is not the one this Link reads, else None.

    Looked up before any parse: a document of another schema may not parse at all, and the operator
    must read "schema" rather than a field-level parse error."""
    match = _SCHEMA_VERSION.search(text)
    version = int(match.group(1)) if match else 0
    if version == INVENTORY_SCHEMA_VERSION:
        return None
    generation = _GENERATION.search(text)
    return InvalidInventory(
        int(generation.group(1)) if generation else generation_hint,
        f"inventory schema_version {version or 'absent (schema 1)'} is not a schema this Link reads "
        f"(it reads {INVENTORY_SCHEMA_VERSION}): upgrade the Link or run a CP that writes schema "
        f"{INVENTORY_SCHEMA_VERSION}",
    )


def parse_inventory(text: str, generation_hint: int = 0) -> Delivery:
    refused = schema_refusal(text, generation_hint)
    if refused is not None:
        return refused
    try:
        return _parse_reusing(text)
    except Exception as exc:  # the whole-document parse below gives the verdict and its message
        log.debug("inventory_parse_fallback", extra={"fields": {"error": repr(exc)[:300]}})
    try:
        return json_format.Parse(text, inventory_pb2.Inventory())
    except json_format.ParseError as exc:
        unknown_kind = _with_unknown_kind(text)
        if unknown_kind is not None:
            return unknown_kind
        return InvalidInventory(generation_hint, f"inventory is not valid proto3 JSON: {exc}")


def _with_unknown_kind(text: str) -> inventory_pb2.Inventory | None:
    """The inventory, read past what this Link does not know, when it holds a policy of a kind this
    Link does not know (a newer CP's: its config member is unknown here); else None.

    The translator refuses every such inventory (UNSUPPORTED_POLICY, with the policy named), so what
    was skipped is never published: it only makes the refusal name the policy instead of a field."""
    try:
        lenient = json_format.Parse(text, inventory_pb2.Inventory(), ignore_unknown_fields=True)
    except json_format.ParseError:
        return None
    if any(p.type not in KINDS and p.WhichOneof("config") is None for p in lenient.policies):
        return lenient
    return None


def _received(text: str, generation_hint: int, source: str) -> Delivery:
    """Parse one delivery and log its size and parse time (a stage of every publication)."""
    started = time.perf_counter()
    delivery = parse_inventory(text, generation_hint)
    log.info(
        "inventory_received",
        extra={
            "fields": {
                "source": source,
                "generation": delivery.generation or generation_hint,
                "bytes": len(text),
                "parse_ms": round((time.perf_counter() - started) * 1000, 2),
            }
        },
    )
    return delivery


def _permissions(data: str) -> ToolPermissions | None:
    try:
        doc = json.loads(data)
        seq, jws = doc["seq"], doc["jws"]
    except (ValueError, TypeError, KeyError):
        log.warning("tool_permissions_unreadable", extra={"fields": {"bytes": len(data)}})
        return None
    if type(seq) is not int or seq < 1 or not isinstance(jws, str):
        log.warning("tool_permissions_unreadable", extra={"fields": {"bytes": len(data)}})
        return None
    return ToolPermissions(seq, jws)


def gateway_client(
    cp_url: str,
    gateway_id: str,
    credential: str,
    transport: httpx.AsyncBaseTransport | None,
    timeout: httpx.Timeout | float,
) -> httpx.AsyncClient:
    """A client for one gateway's CP endpoints: paths relative to /v1/gateways/{gateway_id}/, its
    credential on every request."""
    return httpx.AsyncClient(
        base_url=f"{cp_url.rstrip('/')}/v1/gateways/{gateway_id}/",
        transport=transport,
        timeout=timeout,
        headers={"Authorization": f"Bearer {credential}"},
    )


class CpUnavailable(Exception):
    """The CP could not be reached or answered with an error."""


class GatewayCaller:
    """What calls one gateway's CP endpoints (the CP client, the reporter): the HTTP client with its
    credential, and the backoff between attempts."""

    timeout: httpx.Timeout | float = 10.0

    def __init__(
        self,
        cp_url: str,
        gateway_id: str,
        credential: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.gateway_id = gateway_id
        self._client = gateway_client(cp_url, gateway_id, credential, transport, self.timeout)
        self.backoff = backoff or Backoff()


class CpClient(GatewayCaller):
    # The read timeout outlasts the CP's keep-alive comments, so a silently dead stream is noticed.
    timeout = httpx.Timeout(10.0, read=60.0)

    def __init__(self, *access: str, deltas: bool = True, **options: Any) -> None:
        """`access` and `options` as `GatewayCaller` takes them; `deltas`: follow the event stream as
        deltas (else every event is a complete inventory)."""
        super().__init__(*access, **options)
        self._events = "events?deltas=true" if deltas else "events"
        self.last_event_id: int | None = None
        # True while the event stream is open (answered 200 and not yet lost), for /metrics.
        self.stream_open = False
        # The last complete inventory received (applied or refused), as the deltas apply to it.
        self._held: Elements | None = None
        # Complete fetches a delta caused, by why ("gap", "mismatch", "unreadable"), for /metrics.
        self.refetches: Counter[str] = Counter()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def fetch_config(self) -> Delivery:
        try:
            response = await self._client.get("config")
        except httpx.HTTPError as exc:
            raise CpUnavailable(f"GET /config: {exc!r}") from exc
        if response.status_code != 200:
            raise CpUnavailable(f"GET /config answered {response.status_code}: {response.text[:300]}")
        delivery = _received(response.text, 0, "config")
        self._held = Elements.of(delivery) if isinstance(delivery, inventory_pb2.Inventory) else None
        return delivery

    async def _refetch(self, why: str, detail: str) -> Delivery:
        """The complete inventory again, when a delta cannot be trusted to give it."""
        self._held = None
        self.refetches[why] += 1
        log.warning("inventory_refetch", extra={"fields": {"why": why, "detail": detail[:300]}})
        return await self.fetch_config()

    async def _changed(self, text: str, hint: int) -> Delivery | None:
        """The complete inventory a `delta` event gives applied to the held one (its hash checked), the
        complete inventory fetched when it does not apply, or None for a delta already applied."""
        started = time.perf_counter()
        try:
            delta = parse_delta(text)
        except json_format.ParseError as exc:
            # The complete inventory then says what is wrong (another schema, say) or is fine.
            return await self._refetch("unreadable", str(exc))
        if delta.schema_version != INVENTORY_SCHEMA_VERSION:
            return schema_refusal(text, hint)
        held = self._held
        if held is not None and delta.generation <= held.generation:
            return None
        if held is None or delta.base_generation != held.generation:
            return await self._refetch(
                "gap", f"delta {delta.base_generation}→{delta.generation}, held {held and held.generation}"
            )
        base_hash = held.hash()
        try:
            held.apply(delta)
        except DeltaMismatch as exc:
            return await self._refetch("mismatch", str(exc))
        log.info(
            "inventory_received",
            extra={
                "fields": {
                    "source": "delta",
                    "generation": delta.generation,
                    "base_generation": delta.base_generation,
                    "bytes": len(text),
                    "parse_ms": round((time.perf_counter() - started) * 1000, 2),
                }
            },
        )
        return Changed(delta, held.copy(), base_hash)

    async def _follow(self) -> AsyncIterator[Delivery | ToolPermissions]:
        headers = {} if self.last_event_id is None else {"Last-Event-ID": str(self.last_event_id)}
        try:
            async with aconnect_sse(self._client, "GET", self._events, headers=headers) as source:
                if source.response.status_code != 200:
                    body = (await source.response.aread()).decode(errors="replace")[:300]
                    raise CpUnavailable(f"GET /events answered {source.response.status_code}: {body}")
                self.stream_open = True
                log.info("cp_stream_open", extra={"fields": {"last_event_id": self.last_event_id}})
                async for event in source.aiter_sse():
                    if event.event == "tool-permissions":
                        permissions = _permissions(event.data)
                        if permissions is not None:
                            self.backoff.reset()
                            yield permissions
                        continue
                    hint = int(event.id) if event.id.isdigit() else 0
                    if event.event == "inventory":
                        delivery: Delivery | None = _received(event.data, hint, "events")
                        self._held = (
                            Elements.of(delivery) if isinstance(delivery, inventory_pb2.Inventory) else None
                        )
                    elif event.event == "delta":
                        delivery = await self._changed(event.data, hint)
                        if delivery is None:
                            continue
                    else:
                        continue
                    generation = delivery.generation or hint
                    if generation:
                        self.last_event_id = max(generation, self.last_event_id or 0)
                    # Only a stream that delivers resets the backoff: one that opens and fails its
                    # first event (a refetch the CP cannot answer) must not reconnect at full speed.
                    self.backoff.reset()
                    yield delivery
        except httpx.HTTPError as exc:
            raise CpUnavailable(f"GET /events: {exc!r}") from exc
        finally:
            self.stream_open = False
        raise CpUnavailable("the CP closed the event stream")

    async def deliveries(self) -> AsyncIterator[Delivery | ToolPermissions]:
        """The current inventory, then every newer one, forever; reconnects on any failure."""
        while True:
            try:
                initial = await self.fetch_config()
                break
            except CpUnavailable as exc:
                delay = self.backoff.next_delay()
                log.warning(
                    "cp_unavailable", extra={"fields": {"error": str(exc), "retry_in_s": round(delay, 3)}}
                )
                await asyncio.sleep(delay)
        self.backoff.reset()
        if initial.generation:
            self.last_event_id = initial.generation
        yield initial
        while True:
            try:
                async for delivery in self._follow():
                    yield delivery
            except CpUnavailable as exc:
                delay = self.backoff.next_delay()
                log.warning(
                    "cp_stream_lost",
                    extra={
                        "fields": {
                            "error": str(exc),
                            "last_event_id": self.last_event_id,
                            "retry_in_s": round(delay, 3),
                        }
                    },
                )
                await asyncio.sleep(delay)
