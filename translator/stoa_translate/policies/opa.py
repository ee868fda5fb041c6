"""opa → the authorization service: a Rego v1 module evaluated in-process (regorus) on the
gateway-neutral input of each request, after the route's own checks. No Envoy configuration: the
module travels in the authorization policy set on the routes it applies to.

A module that does not compile is refused here, so at the CP (422 naming `config.module`) and, should
one reach a site, by the Link (FAILED) and the service (NACK).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stoa_proto import inventory_pb2

from stoa_translate.policies.kind import MAX_DOCUMENT, ConfigError, PolicyKind
from stoa_translate.rego import DEFAULT_ENTRYPOINT, RegoError, compiled

_ENTRYPOINT = re.compile(r"^data(\.[A-Za-z_][A-Za-z0-9_]*)+$")


@dataclass(frozen=True)
class Opa:
    policy_id: str
    module: str
    entrypoint: str

    def message(self) -> inventory_pb2.OpaPolicy:
        return inventory_pb2.OpaPolicy(module=self.module, entrypoint=self.entrypoint)


def parse(policy_id: str, config: inventory_pb2.OpaPolicy) -> Opa:
    if not config.module.strip():
        raise ConfigError("module", "must be a Rego module")
    if len(config.module) > MAX_DOCUMENT:
        raise ConfigError("module", f"must be at most {MAX_DOCUMENT} characters")
    entrypoint = config.entrypoint or DEFAULT_ENTRYPOINT
    if not _ENTRYPOINT.match(entrypoint):
        raise ConfigError("entrypoint", "must be a rule path such as data.stoa.allow")
    try:
        compiled(policy_id, config.module)
    except RegoError as exc:
        raise ConfigError("module", f"does not compile: {exc}") from None
    return Opa(policy_id, config.module, entrypoint)


def normalised(ir: Opa) -> inventory_pb2.OpaPolicy:
    return ir.message()


KIND = PolicyKind(
    name="opa",
    filter_name="",
    message=inventory_pb2.OpaPolicy,
    parse=parse,
    normalised=normalised,
    listener_filter=None,
    route_config=None,
    long_text=frozenset({"module"}),
)
