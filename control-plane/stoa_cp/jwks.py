"""Trusted issuers' key sets: validation (public keys only) and bounded fetching of a jwks_uri."""

from __future__ import annotations

import json
import warnings
from typing import Any

import httpx
from joserfc.jwk import JWKRegistry

from stoa_cp.problems import Problem
from stoa_cp.schemas import unstorable

ALLOWED_KTY = ("RSA", "EC", "OKP")
# Members that only a private (or symmetric) key carries; a site must never receive them.
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
MAX_JWKS_BYTES = 512 * 1024


class JwksError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def problem(self, status: int = 422) -> Problem:
        return Problem(status, "Invalid JWKS", [(self.field, self.message)])


def check(doc: object, field: str) -> dict[str, Any]:
    """Return the JWKS as {"keys": [...]} or raise JwksError naming the bad member under `field`."""
    if not isinstance(doc, dict):
        raise JwksError(field, "must be a JSON object with a 'keys' array")
    found = unstorable(doc, field)
    if found is not None:
        raise JwksError(*found)
    keys = doc.get("keys")
    if not isinstance(keys, list) or not keys:
        raise JwksError(f"{field}.keys", "must be a non-empty array of keys")
    seen: set[str] = set()
    for i, key in enumerate(keys):
        where = f"{field}.keys[{i}]"
        if not isinstance(key, dict):
            raise JwksError(where, "must be a JSON object")
        kty, kid = key.get("kty"), key.get("kid")
        if kty not in ALLOWED_KTY:
            raise JwksError(f"{where}.kty", f"must be one of {', '.join(ALLOWED_KTY)} (public keys only)")
        if not isinstance(kid, str) or not kid:
            raise JwksError(f"{where}.kid", "is required (a non-empty string)")
        if kid in seen:
            raise JwksError(f"{where}.kid", f"duplicate kid {kid!r}")
        seen.add(kid)
        private = [m for m in PRIVATE_MEMBERS if m in key]
        if private:
            raise JwksError(
                f"{where}.{private[0]}", "private key material is refused; publish public keys only"
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parsed = JWKRegistry.import_key(key)
                _ = parsed.public_key  # forces the key material to be decoded
        except Exception as exc:
            raise JwksError(where, f"is not a usable {kty} public key ({exc})") from None
    return {"keys": keys}


async def fetch_json(uri: str, timeout_s: float, field: str) -> object:
    """GET the JSON document at `uri` within `timeout_s` and MAX_JWKS_BYTES; JwksError(field) on failure."""
    try:
        async with (
            httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as client,
            client.stream("GET", uri, headers={"accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise JwksError(field, f"fetching {uri} answered HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body.extend(chunk)
                if len(body) > MAX_JWKS_BYTES:
                    raise JwksError(field, f"the document at {uri} exceeds {MAX_JWKS_BYTES} bytes")
    except httpx.HTTPError as exc:
        raise JwksError(field, f"fetching {uri} failed: {type(exc).__name__} {exc}".strip()) from None
    try:
        return json.loads(bytes(body))
    except ValueError:
        raise JwksError(field, f"the document at {uri} is not JSON") from None


async def fetch(uri: str, timeout_s: float) -> dict[str, Any]:
    """GET the key set at `uri` within `timeout_s`; raise JwksError(field='jwks_uri') on any failure."""
    doc = await fetch_json(uri, timeout_s, "jwks_uri")
    try:
        return check(doc, "jwks")
    except JwksError as exc:
        raise JwksError("jwks_uri", f"the document at {uri} is not a valid JWKS: {exc}") from None
