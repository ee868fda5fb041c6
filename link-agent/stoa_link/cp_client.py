"""The Link's view of the CP: the config endpoint, then the SSE stream, resumed by generation.

The Link always connects out. During an outage nothing here touches what the ADS server serves; the
client reconnects with bounded, fully jittered exponential backoff and resumes with Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from google.protobuf import json_format
from httpx_sse import aconnect_sse
from stoa_proto import inventory_pb2

log = logging.getLogger("stoa_link.cp_client")


class Backoff:
    """Full-jitter exponential backoff: a uniform delay in [0, min(cap, base·2^attempt)]."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 10.0) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base_s, self.cap_s = base_s, cap_s
        self.attempt = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.attempt, 32))
        self.attempt += 1
        return random.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0

    async def sleep(self) -> None:
        await asyncio.sleep(self.next_delay())


@dataclass(frozen=True)
class InvalidInventory:
    """A delivery that is not a valid Inventory document: reported FAILED, never applied."""

    generation: int
    detail: str


Delivery = inventory_pb2.Inventory | InvalidInventory


def parse_inventory(text: str, generation_hint: int = 0) -> Delivery:
    try:
        return json_format.Parse(text, inventory_pb2.Inventory())
    except json_format.ParseError as exc:
        return InvalidInventory(generation_hint, f"inventory is not valid proto3 JSON: {exc}")


class CpUnavailable(Exception):
    """The CP could not be reached or answered with an error."""


class CpClient:
    def __init__(
        self,
        cp_url: str,
        gateway_id: str,
        credential: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff: Backoff | None = None,
        read_timeout_s: float = 60.0,
    ) -> None:
        self.base = f"{cp_url.rstrip('/')}/v1/gateways/{gateway_id}"
        self._headers = {"Authorization": f"Bearer {credential}"}
        # The read timeout outlasts the CP's keep-alive comments, so a silently dead stream is noticed.
        self._client = httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(10.0, read=read_timeout_s), headers=self._headers
        )
        self.backoff = backoff or Backoff()
        self.last_event_id: int | None = None

    async def aclose(self) -> None:
        await self._client.aclose()

    async def fetch_config(self) -> Delivery:
        try:
            response = await self._client.get(f"{self.base}/config")
        except httpx.HTTPError as exc:
            raise CpUnavailable(f"GET /config: {exc!r}") from exc
        if response.status_code != 200:
            raise CpUnavailable(f"GET /config answered {response.status_code}: {response.text[:300]}")
        return parse_inventory(response.text)

    async def _follow(self) -> AsyncIterator[Delivery]:
        headers = {} if self.last_event_id is None else {"Last-Event-ID": str(self.last_event_id)}
        try:
            async with aconnect_sse(self._client, "GET", f"{self.base}/events", headers=headers) as source:
                if source.response.status_code != 200:
                    body = (await source.response.aread()).decode(errors="replace")[:300]
                    raise CpUnavailable(f"GET /events answered {source.response.status_code}: {body}")
                self.backoff.reset()
                log.info("cp_stream_open", extra={"fields": {"last_event_id": self.last_event_id}})
                async for event in source.aiter_sse():
                    if event.event != "inventory":
                        continue
                    hint = int(event.id) if event.id.isdigit() else 0
                    delivery = parse_inventory(event.data, hint)
                    generation = delivery.generation or hint
                    if generation:
                        self.last_event_id = max(generation, self.last_event_id or 0)
                    yield delivery
        except httpx.HTTPError as exc:
            raise CpUnavailable(f"GET /events: {exc!r}") from exc
        raise CpUnavailable("the CP closed the event stream")

    async def deliveries(self) -> AsyncIterator[Delivery]:
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
