"""A snapshot's Envoy resources as one static bootstrap (routes inlined instead of RDS over ADS, and
scopes with their tables inlined instead of Scoped RDS).

For `envoy --mode validate` (which cannot follow `ads {}` references) and for running a rendered
configuration without an ADS server. Several snapshots can share one bootstrap: each gets its own
listener (renamed, on its own port); clusters of one name must be identical, which naming by backend
identity guarantees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from stoa_translate.snapshot import CLUSTER, LISTENER, ROUTE, SCOPED_ROUTE, Snapshot


def _doc(resource: Any) -> dict[str, Any]:
    return json_format.MessageToDict(resource, preserving_proto_field_name=True)


def static_bootstrap(
    snapshots: Mapping[str, tuple[Snapshot, int]], admin_port: int | None = None
) -> dict[str, Any]:
    """`snapshots`: label → (snapshot, listener port). The listener of each is named `<name>-<label>`."""
    clusters: dict[str, dict[str, Any]] = {}
    listeners = []
    for label, (snapshot, port) in sorted(snapshots.items()):
        for cluster in snapshot.of(CLUSTER):
            doc = _doc(cluster)
            if clusters.setdefault(cluster.name, doc) != doc:
                raise ValueError(f"{label}: cluster {cluster.name} differs from another snapshot's")
        tables = {table.name: _doc(table) for table in snapshot.of(ROUTE)}  # type: ignore[attr-defined]
        (listener,) = snapshot.of(LISTENER)
        doc = _doc(listener)
        doc["name"] = f"{listener.name}-{label}"
        doc["address"]["socket_address"]["port_value"] = port
        for chain in doc["filter_chains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typed_config"]
                rds = manager.pop("rds", None)
                if rds is not None:
                    manager["route_config"] = tables[rds["route_config_name"]]
                scoped = manager.get("scoped_routes")
                if scoped is not None:
                    # Each scope with its table inline, instead of scopes and tables over ADS.
                    del scoped["scoped_rds"]
                    scopes = []
                    for scope in snapshot.of(SCOPED_ROUTE):
                        scope_doc = _doc(scope)
                        scope_doc["route_configuration"] = tables[scope_doc.pop("route_configuration_name")]
                        scopes.append(scope_doc)
                    scoped["scoped_route_configurations_list"] = {"scoped_route_configurations": scopes}
        listeners.append(doc)
    bootstrap: dict[str, Any] = {
        "node": {"id": "stoa-static", "cluster": "stoa-static"},
        "static_resources": {"clusters": list(clusters.values()), "listeners": listeners},
    }
    if admin_port is not None:
        bootstrap["admin"] = {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        }
    return bootstrap


def validate_command(binary: str, bootstrap: str, base_id: int) -> list[str]:
    """`envoy --mode validate` of the bootstrap file, errors only, with its own shared-memory id
    (`base_id`, taken modulo 60,000) so that it cannot collide with an Envoy running on the machine."""
    return [binary, "--mode", "validate", "-c", bootstrap, "-l", "error", "--base-id", str(base_id % 60000)]
