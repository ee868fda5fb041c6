"""Phase 4 (authorise), OPA: a route's Rego policy evaluated in-process (regorus) on the
gateway-neutral input of the request. Allowed only when the entrypoint's value is exactly `true`;
undefined, `false`, any other value or an evaluation error is `policy_denied`.

The input (documented in the README):
`{"method", "path", "path_segments": [...], "query": {name: [values]}, "headers": {name: value},
"identity": {"tenant", "subject", "scopes": [...], "consumer"}, "api": {"id", "tenant"}}`;
headers without credentials (`authorization`, `cookie`, `proxy-authorization`, the route's key header),
without inbound identity headers and without pseudo-headers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, unquote

import regorus
from stoa_proto.client_headers import is_identity_header
from stoa_translate.rego import compiled

_CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


class RegoPolicy:
    """A compiled module (checked when the policy set loads) and one engine per Check thread: a
    regorus engine may only be used by the thread that made it, and holds one input at a time."""

    def __init__(self, name: str, module: str, entrypoint: str) -> None:
        compiled(name, module)  # RegoError now, at load, rather than at the first request
        self._name = name
        self._module = module
        self._entrypoint = entrypoint
        self._local = threading.local()

    def _engine(self) -> regorus.Engine:
        engine: regorus.Engine | None = getattr(self._local, "engine", None)
        if engine is None:
            engine = self._local.engine = compiled(self._name, self._module)
        return engine

    def allows(self, document: Mapping[str, Any]) -> bool:
        engine = self._engine()
        try:
            engine.set_input_json(json.dumps(document, separators=(",", ":")))
            value = engine.eval_rule(self._entrypoint)
        except Exception:
            # An evaluation error (a conflict between rules, a built-in's error) is a denial.
            return False
        return value is True


def neutral_input(
    method: str,
    raw_path: str,
    headers: Mapping[str, str],
    key_header: str,
    api: tuple[str, str],
    identity: Mapping[str, Any],
) -> dict[str, Any]:
    path, _, query = raw_path.partition("?")
    return {
        "method": method,
        "path": path,
        "path_segments": [unquote(s) for s in path.split("/") if s],
        "query": parse_qs(query, keep_blank_values=True),
        "headers": {
            name: value
            for name, value in headers.items()
            if not name.startswith(":")
            and name not in _CREDENTIALS
            and name != key_header
            and not is_identity_header(name)
        },
        "identity": dict(identity),
        "api": {"id": api[0], "tenant": api[1]},
    }


def identity_input(
    tenant: str | None, subject: str | None, scopes: Iterable[str], consumer: str | None
) -> dict[str, Any]:
    return {"tenant": tenant, "subject": subject, "scopes": sorted(scopes), "consumer": consumer}
