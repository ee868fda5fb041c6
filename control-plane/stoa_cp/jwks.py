"""Trusted issuers' key sets: validation (public keys only) and bounded fetching of a jwks_uri."""

from __future__ import annotations

import json
from typing import Any

import httpx
from stoa_translate import jwks as keysets

from stoa_cp.problems import Problem
from stoa_cp.schemas import unstorable

MAX_JWKS_BYTES = keysets.MAX_JWKS_BYTES


class JwksError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def problem(self, status: int = 422) -> Problem:
        return Problem(status, "Invalid JWKS", [(self.field, self.message)])


def check(doc: object, field: str) -> dict[str, Any]:
    """Return the JWKS as stored, or raise JwksError naming the bad member under `field`: by the rule
    the authorization service loads keys with (`stoa_translate.jwks`), so a key set accepted here is
    never refused at a site."""
    if not isinstance(doc, dict):
        raise JwksError(field, "must be a JSON object with a 'keys' array")
    found = unstorable(doc, field)
    if found is not None:
        raise JwksError(*found)
    try:
        return keysets.accept(doc, needs_a_key=True)
    except keysets.KeySetError as exc:
        raise JwksError(f"{field}.{exc.path}" if exc.path else field, exc.message) from None


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
