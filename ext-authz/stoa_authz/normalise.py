"""Phase 1, normalise: lower-case header names, refuse duplicates of single-valued headers, control
characters, and a path `stoa_proto.paths` refuses (a hidden dot segment, a foreign escape; Envoy refuses
those first).
Envoy hands headers either as a map whose repeated values it joined with "," (`headers`) or, with
`encode_raw_headers`, as a list of raw entries (`header_map`)."""

from __future__ import annotations

from envoy.service.auth.v3.attribute_context_pb2 import AttributeContext
from stoa_proto.paths import is_refused

from stoa_authz.reasons import Deny, Reason

API_KEY_HEADER = "x-api-key"
# None of these may appear twice; none of their legitimate values contains a comma, so a comma in
# the joined map form means the client sent the header more than once.
SINGLE_VALUED = frozenset({"authorization", "host", ":authority", API_KEY_HEADER})
_FORBIDDEN = ("\r", "\n", "\x00")


def normalise(http: AttributeContext.HttpRequest) -> dict[str, str]:
    if is_refused(http.path):
        raise Deny(Reason.MALFORMED_REQUEST)
    headers: dict[str, str] = {}
    if http.header_map.headers:
        for entry in http.header_map.headers:
            name = entry.key.lower()
            value = entry.raw_value.decode("utf-8", "surrogateescape") if entry.raw_value else entry.value
            if name in headers:
                if name in SINGLE_VALUED:
                    raise Deny(Reason.MALFORMED_REQUEST)
                headers[name] = f"{headers[name]},{value}"
            else:
                headers[name] = value
    else:
        for key, value in http.headers.items():
            name = key.lower()
            if name in headers:  # two keys differing only in case
                if name in SINGLE_VALUED:
                    raise Deny(Reason.MALFORMED_REQUEST)
                headers[name] = f"{headers[name]},{value}"
            else:
                headers[name] = value
        for name in SINGLE_VALUED:
            if "," in headers.get(name, ""):
                raise Deny(Reason.MALFORMED_REQUEST)
    for value in headers.values():
        if any(ch in value for ch in _FORBIDDEN):
            raise Deny(Reason.MALFORMED_REQUEST)
    return headers
