"""Envoy's native denials, as its gRPC access log delivers them, become decision events."""

from __future__ import annotations

import json
import logging

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from stoa_link.envoy_decisions import EnvoyDecisions
from stoa_proto import authz_pb2
from stoa_translate.snapshot import AUTHZ_POLICY_SET, Snapshot


def entry(
    details: str, route_name: str = "orders:GET", request_id: str = "rid-1"
) -> accesslog_pb2.HTTPAccessLogEntry:
    log_entry = accesslog_pb2.HTTPAccessLogEntry()
    log_entry.response.response_code_details = details
    log_entry.common_properties.route_name = route_name
    log_entry.common_properties.time_to_last_downstream_tx_byte.FromMicroseconds(1500)
    log_entry.request.request_id = request_id
    return log_entry


def served() -> Snapshot:
    policy_set = authz_pb2.AuthzPolicySet(
        name="default",
        version="v7",
        routes=[authz_pb2.AuthzRoute(route_id="orders", tenant_id="acme", api_id="orders-api")],
    )
    return Snapshot.build("gw-1", 3, {AUTHZ_POLICY_SET: [policy_set]})


def test_a_native_denial_is_one_event_with_its_reason_and_route(caplog: pytest.LogCaptureFixture) -> None:
    decisions = EnvoyDecisions("spiffe://stoa.local/envoy", served)
    with caplog.at_level(logging.INFO, logger="stoa_link.decision"):
        decisions.record(entry("jwt_authn_access_denied{Audiences_in_Jwt_are_not_allowed}"))
        decisions.record(entry("rbac_access_denied_matched_policy[stoa:scope]", route_name="orders:ANY"))
        # Not a native denial (an address rule's, an upstream's answer): no event.
        decisions.record(entry("rbac_access_denied_matched_policy[deny-office]"))
        decisions.record(entry("via_upstream"))
    events = [(r.getMessage(), r.fields) for r in caplog.records]  # type: ignore[attr-defined]
    assert [name for name, _ in events] == ["ext_authz_decision"] * 2
    first, second = (fields for _, fields in events)
    assert first == {
        "decision": "deny",
        "reason": "wrong_audience",
        "tenant": "acme",
        "api": "orders-api",
        "route": "orders",
        "request_id": "rid-1",
        "latency_ms": 1.5,
        "policy_set_version": "v7",
        "decided_by": "envoy",
    }
    assert second["reason"] == "insufficient_scope"
    assert json.dumps(first)  # plain JSON values only


def test_before_any_snapshot_the_event_still_says_why(caplog: pytest.LogCaptureFixture) -> None:
    decisions = EnvoyDecisions("spiffe://stoa.local/envoy", lambda: None)
    with caplog.at_level(logging.INFO, logger="stoa_link.decision"):
        decisions.record(entry("jwt_authn_access_denied{Jwt_is_missing}"))
    [record] = caplog.records
    fields = record.fields  # type: ignore[attr-defined]
    assert (fields["reason"], fields["route"], fields["tenant"]) == ("missing_token", "orders", "")
