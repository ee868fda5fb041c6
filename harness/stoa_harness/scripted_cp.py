"""A scripted control plane: the gateway side of the CP contract, serving inventories a test chooses.

The real CP never produces a stale, foreign or route-losing inventory, so the Link's guard is proven
against this stand-in: the same `/config`, `/events` (SSE) and `/sync-reports` endpoints, the same
gateway-credential check, and inventories pushed verbatim, whatever their generation or gateway.

    with ScriptedCP("gw-1", credential) as cp:          # STOA_LINK_CP_URL = cp.url
        cp.push(inventory)                              # becomes /config and goes to every SSE stream
        cp.push_delta(inventory, corrupt=True)          # the same, sent as a (here corrupted) delta
        cp.wait_report(generation=2, status="FAILED")   # the SyncReport the Link posted (a dict)
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from stoa_cp.auth import bearer
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_proto.inventory_delta import diff

from stoa_harness.asgi_thread import Receive, Scope, Send, ServedByThread, ThreadedASGIServer, read_body
from stoa_harness.site import Site
from stoa_harness.wait import wait_until

KEEP_ALIVE_S = 5.0


def inventory_json(inventory: inventory_pb2.Inventory) -> str:
    """As the CP writes it: proto3 JSON, with the CP's schema version unless the test set another."""
    doc = json_format.MessageToDict(inventory, preserving_proto_field_name=True)
    doc.setdefault("schema_version", INVENTORY_SCHEMA_VERSION)
    return json.dumps(doc)


def _with_schema(inventory: inventory_pb2.Inventory) -> inventory_pb2.Inventory:
    if inventory.schema_version:
        return inventory
    copy = inventory_pb2.Inventory()
    copy.CopyFrom(inventory)
    copy.schema_version = INVENTORY_SCHEMA_VERSION
    return copy


def add_open_route(inventory: inventory_pb2.Inventory, route_id: str, upstream_url: str) -> None:
    """A GET route `route_id` of tenant `t` (its API too), without auth: /apis/{route_id} to
    {upstream_url}/{route_id}."""
    inventory.routes.add(
        route_id=route_id,
        tenant_id="t",
        api_id=route_id,
        path_prefix=f"/apis/{route_id}",
        methods=["GET"],
        upstream_url=f"{upstream_url}/{route_id}",
        auth_mode="none",
    )


class ScriptedCP(ServedByThread):
    def __init__(self, gateway_id: str, credential: str) -> None:
        self.gateway_id = gateway_id
        self.credential = credential
        self._lock = threading.Lock()
        self._current = inventory_pb2.Inventory(gateway_id=gateway_id, generation=1)
        self._reports: list[dict[str, Any]] = []
        self._config_fetches = 0
        self._streams: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[str | None]]] = []
        self._http = ThreadedASGIServer(self._app, "scripted-cp")

    def stop(self) -> None:
        self._broadcast(None)  # end every open event stream so the server can shut down
        super().stop()

    # -- what tests script and read ---------------------------------------------------------------
    def site(self, run_dir: Path) -> Site:
        """A site (Link, Envoy, Check witness) following this CP as its gateway, not yet started."""
        return Site(run_dir=run_dir, cp_url=self.url, gateway_id=self.gateway_id, credential=self.credential)

    def push(self, inventory: inventory_pb2.Inventory) -> None:
        """Serve `inventory` from /config and send it as an `inventory` event on every open stream."""
        with self._lock:
            self._current = inventory
        self._broadcast(self._event(inventory))

    def push_delta(
        self,
        inventory: inventory_pb2.Inventory,
        *,
        base: int | None = None,
        corrupt: bool = False,
        data: str | None = None,
    ) -> None:
        """Serve `inventory` from /config and send the delta to it from the current one as a `delta`
        event: labelled with another `base` generation (a gap), `corrupt`ed (an element changed
        after hashing: the Link's hash check fails), or with `data` instead of the delta, when the
        test asks."""
        inventory = _with_schema(inventory)
        with self._lock:
            delta = diff(_with_schema(self._current), inventory)
            self._current = inventory
        if base is not None:
            delta.base_generation = base
        if corrupt:
            delta.routes[0].upstream_url += "/not-what-was-hashed"
        if data is None:
            data = json_format.MessageToJson(delta, preserving_proto_field_name=True, indent=None)
        self._broadcast(f"event: delta\nid: {inventory.generation}\ndata: {data}\n\n")

    def config_fetches(self) -> int:
        """How many times /config was fetched."""
        with self._lock:
            return self._config_fetches

    def reports(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._reports)

    def stream_count(self) -> int:
        with self._lock:
            return len(self._streams)

    def wait_report(
        self, generation: int, status: str, *, after: int = 0, timeout: float = 20.0
    ) -> dict[str, Any]:
        """The first report for `generation` among those received after the first `after` reports
        (mark with `len(cp.reports())` before a push); fails if it carries another status."""

        def found() -> dict[str, Any] | None:
            fresh = self.reports()[after:]
            return next((r for r in fresh if int(r.get("generation", 0)) == generation), None)

        report = wait_until(found, timeout, f"a sync report for generation {generation}")
        assert report.get("status") == status, f"expected {status} for generation {generation}, got {report}"
        return report

    # -- plumbing ---------------------------------------------------------------------------------
    @staticmethod
    def _event(inventory: inventory_pb2.Inventory) -> str:
        return f"event: inventory\nid: {inventory.generation}\ndata: {inventory_json(inventory)}\n\n"

    def _broadcast(self, event: str | None) -> None:
        with self._lock:
            streams = list(self._streams)
        for loop, queue in streams:
            loop.call_soon_threadsafe(queue.put_nowait, event)

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        parts = scope["path"].strip("/").split("/")
        if len(parts) != 4 or parts[:2] != ["v1", "gateways"]:
            await _reply(send, 404, {"title": "Not found"})
            return
        gateway_id, endpoint = parts[2], parts[3]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        # The CP's own reading of the header: a bare credential is refused like a wrong one.
        credential = bearer(headers.get("authorization"))
        if not credential or not hmac.compare_digest(credential.encode(), self.credential.encode()):
            await _reply(send, 401, {"title": "Unauthorized"})
            return
        if gateway_id != self.gateway_id:
            await _reply(send, 403, {"title": "Forbidden"})
            return
        method = scope["method"]
        if endpoint == "config" and method == "GET":
            with self._lock:
                self._config_fetches += 1
                body = inventory_json(self._current).encode()
            await _reply(send, 200, body)
        elif endpoint == "events" and method == "GET":
            await self._stream(headers.get("last-event-id"), receive, send)
        elif endpoint == "sync-reports" and method == "POST":
            report = json.loads(await read_body(receive))
            # The contract: a SyncReport in proto3 JSON (reject anything that is not).
            json_format.ParseDict(report, inventory_pb2.SyncReport())
            with self._lock:
                self._reports.append(report)
            await _reply(send, 202, {})
        else:
            await _reply(send, 404, {"title": "Not found"})

    async def _stream(self, last_event_id: str | None, receive: Receive, send: Send) -> None:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        entry = (asyncio.get_running_loop(), queue)
        with self._lock:
            current = self._current
            self._streams.append(entry)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
                }
            )
            if last_event_id is None or current.generation > int(last_event_id or 0):
                queue.put_nowait(self._event(current))
            disconnected = asyncio.ensure_future(_until_disconnect(receive))
            try:
                while not disconnected.done():
                    getter = asyncio.ensure_future(queue.get())
                    done, _ = await asyncio.wait(
                        {getter, disconnected}, timeout=KEEP_ALIVE_S, return_when=asyncio.FIRST_COMPLETED
                    )
                    if getter not in done:
                        getter.cancel()
                        chunk = ": keep-alive\n\n" if not disconnected.done() else None
                    else:
                        chunk = getter.result()
                        if chunk is None:
                            break
                    if chunk is not None:
                        await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            finally:
                disconnected.cancel()
        except OSError:
            pass  # the Link went away mid-send
        finally:
            with self._lock:
                self._streams.remove(entry)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _reply(send: Send, status: int, body: dict[str, Any] | bytes) -> None:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    content_type = b"application/json" if status < 400 else b"application/problem+json"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
