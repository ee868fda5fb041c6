"""The caller's identity envelope as the module reads it: verified, and taken once."""

from __future__ import annotations

import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from stoa_mcp.identity import EnvelopeVerifier, NotIdentified
from stoa_translate import jwks as keysets

ISSUER = "stoa-authz"


def envelope(key: Ed25519PrivateKey, **claims: object) -> str:
    now = int(time.time())
    payload = {
        "iss": ISSUER,
        "tenant": "t",
        "api": "mcp",
        "sub": "bob",
        "scopes": [],
        "iat": now,
        "exp": now + 60,
    }
    body = json.dumps({**payload, **claims}).encode()
    return keysets.sign_compact(key, keysets.header_segment("k1", "JWT"), body)


def verifier(key: Ed25519PrivateKey) -> EnvelopeVerifier:
    found = EnvelopeVerifier("http://127.0.0.1:9/keys", ISSUER, http=None)  # type: ignore[arg-type]
    found._keys["k1"] = key.public_key()
    return found


def respelled(token: str) -> list[str]:
    """The same envelope with its signature written otherwise: padded, in the standard alphabet, and
    with the unused low bits of its last character set."""
    head, body, signature = token.split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet[alphabet.index(signature[-1]) ^ 1]
    return [
        f"{head}.{body}.{signature}==",
        f"{head}.{body}.{signature.replace('-', '+').replace('_', '/')}",
        f"{head}.{body}.{signature[:-1]}{last}",
    ]


async def test_an_envelope_is_taken_once_however_its_signature_is_spelled() -> None:
    key = Ed25519PrivateKey.generate()
    token = envelope(key, sub="alice")
    while "-" not in token.split(".")[2] and "_" not in token.split(".")[2]:
        token = envelope(key, sub="alice", request_id=str(time.monotonic()))  # an alphabet to swap
    reader = verifier(key)
    assert (await reader.caller(token)).consumer == "alice"
    for again in [token, *respelled(token)]:
        with pytest.raises(NotIdentified, match="presented again"):
            await reader.caller(again)
    other = envelope(key, sub="alice", request_id="another request")
    assert (await reader.caller(other)).consumer == "alice"


async def test_an_envelope_taken_is_forgotten_once_it_has_expired() -> None:
    key = Ed25519PrivateKey.generate()
    now = [time.time()]
    reader = verifier(key)
    reader.clock = lambda: now[0]
    token = envelope(key)
    await reader.caller(token)
    now[0] += 60 + reader.skew_s + 1
    with pytest.raises(NotIdentified, match="expired"):
        await reader.caller(token)
    later = envelope(key, iat=int(now[0]), exp=int(now[0]) + 60)
    await reader.caller(later)
    assert len(reader.taken) == 1  # the expired one is no longer held
