"""SYNCED / FAILED reports to the CP, delivered with retries; the latest report always wins.

The CP's state is about the desired generation, so an undelivered older report is worthless once a
newer one exists: the reporter keeps one pending slot and retries it until the CP takes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httpx
from google.protobuf import json_format
from stoa_proto import inventory_pb2

from stoa_link.cp_client import GatewayCaller

log = logging.getLogger("stoa_link.reporter")

# A 4xx other than these will not succeed by retrying the same body.
_RETRYABLE = {408, 425, 429}
DELIVERED_KEPT = 32


def report_json(report: inventory_pb2.SyncReport) -> str:
    return json_format.MessageToJson(report, preserving_proto_field_name=True, indent=None)


class Reporter(GatewayCaller):
    def __init__(
        self, *access: str, settings: inventory_pb2.TranslateSettings | None = None, **options: Any
    ) -> None:
        """`access` and `options` as `GatewayCaller` takes them."""
        super().__init__(*access, **options)
        # Sent with every report: the CP previews this gateway's translation with them.
        self.settings = settings
        self._pending: inventory_pb2.SyncReport | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # The most recent deliveries, for inspection; bounded so a long-lived Link does not grow.
        self.delivered: deque[inventory_pb2.SyncReport] = deque(maxlen=DELIVERED_KEPT)

    def submit(self, report: inventory_pb2.SyncReport) -> None:
        """Queue `report`, replacing any older report not yet delivered."""
        report.gateway_id = report.gateway_id or self.gateway_id
        if self.settings is not None and not report.HasField("settings"):
            report.settings.CopyFrom(self.settings)
        if self._pending is not None:
            log.info("report_superseded", extra={"fields": {"generation": self._pending.generation}})
        self._pending = report
        self._idle.clear()
        self._wake.set()

    async def wait_idle(self) -> None:
        """Until every submitted report was delivered (or dropped as undeliverable)."""
        await self._idle.wait()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending is not None:
                report = self._pending
                outcome = await self._post(report)
                if outcome == "retry":
                    delay = self.backoff.next_delay()
                    log.warning(
                        "report_retry",
                        extra={"fields": {"generation": report.generation, "retry_in_s": round(delay, 3)}},
                    )
                    await asyncio.sleep(delay)
                    continue
                self.backoff.reset()
                if self._pending is report:
                    self._pending = None
            self._idle.set()

    async def _post(self, report: inventory_pb2.SyncReport) -> str:
        fields = {
            "generation": report.generation,
            "status": inventory_pb2.SyncStatus.Name(report.status),
            "reason": inventory_pb2.FailureReason.Name(report.reason),
            "snapshot_version": report.snapshot_version,
        }
        try:
            response = await self._client.post(
                "sync-reports", content=report_json(report), headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as exc:
            log.warning("report_unreachable", extra={"fields": {**fields, "error": repr(exc)}})
            return "retry"
        if response.is_success:
            self.delivered.append(report)
            log.info("report_delivered", extra={"fields": fields})
            return "done"
        if response.status_code >= 500 or response.status_code in _RETRYABLE:
            log.warning(
                "report_refused_retry", extra={"fields": {**fields, "status_code": response.status_code}}
            )
            return "retry"
        log.error(
            "report_rejected",
            extra={"fields": {**fields, "status_code": response.status_code, "body": response.text[:300]}},
        )
        return "dropped"
