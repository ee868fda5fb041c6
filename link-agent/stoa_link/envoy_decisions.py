"""Envoy's own denials → `ext_authz_decision` events, written by the Link.

On a route decided natively no authorization service sees the request, so Envoy's access log is the
record: the listener sends the entries of native denials only (filtered in Envoy) over gRPC access
logging to this service, on the Link's own mutually-authenticated ADS server, where only the verified
Envoy identity may stream. Each entry becomes one event in the service's format, with the reason
`stoa_translate.error_contract` derives from Envoy's response code details, and the route's tenant,
API and policy-set version from the snapshot Envoy was serving.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from google.protobuf.message import Message
from stoa_proto.decisions import DECISION_EVENT
from stoa_translate.decision.error_contract import reason_of
from stoa_translate.policy_set import set_version
from stoa_translate.snapshot import AUTHZ_POLICY_SET, Snapshot

from stoa_link.ads.identity import peer_identity

log = logging.getLogger("stoa_link.decision")


class EnvoyDecisions(als_pb2_grpc.AccessLogServiceServicer):
    """`served` gives the snapshot Envoy acknowledged (its policy set maps a route to its tenant and
    API); `envoy_san` is the only identity that may stream."""

    def __init__(self, envoy_san: str, served: Callable[[], Snapshot | None]) -> None:
        self._envoy_san = envoy_san
        self._served = served
        self._routes: dict[str, tuple[str, str]] = {}
        self._version = ""
        self._resources: tuple[Message, ...] = ()

    async def StreamAccessLogs(
        self,
        request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext,
    ) -> als_pb2.StreamAccessLogsResponse:
        identity, why = peer_identity(context)
        if identity != self._envoy_san:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why or f"identity {identity} may not log")
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                self.record(entry)
        return als_pb2.StreamAccessLogsResponse()

    def record(self, entry: accesslog_pb2.HTTPAccessLogEntry) -> None:
        reason = reason_of(entry.response.response_code_details)
        if reason is None:  # the listener sends native denials only; anything else is not one
            return
        common = entry.common_properties
        route = common.route_name.rpartition(":")[0] or common.route_name
        tenant, api = self._route(route)
        log.info(
            DECISION_EVENT,
            extra={
                "fields": {
                    "decision": "deny",
                    "reason": reason.value,
                    "tenant": tenant,
                    "api": api,
                    "route": route,
                    "request_id": entry.request.request_id,
                    "latency_ms": round(common.time_to_last_downstream_tx_byte.ToMicroseconds() / 1000, 3),
                    "policy_set_version": self._version,
                    "decided_by": "envoy",
                }
            },
        )

    def _route(self, route_id: str) -> tuple[str, str]:
        snapshot = self._served()
        # The policy set's resources (`default` and the route buckets): a snapshot holds them as one
        # tuple, the same object while they are unchanged.
        resources = snapshot.of(AUTHZ_POLICY_SET) if snapshot is not None else ()
        if resources and resources is not self._resources:
            self._routes = {r.route_id: (r.tenant_id, r.api_id) for s in resources for r in s.routes}  # type: ignore[attr-defined]
            self._version = set_version(resources)  # type: ignore[arg-type]
            self._resources = resources
        return self._routes.get(route_id, ("", ""))
