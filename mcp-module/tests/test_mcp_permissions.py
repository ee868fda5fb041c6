"""The signed tool permissions: what the module honours, what it refuses, and the grant decision."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from stoa_mcp.permissions import Caller, Permissions, Refused, load_pinned_keys
from stoa_proto.tool_permissions import ToolGrant, ToolPermissionClaims, ToolRevocation

NOW = 1_800_000_000
GATEWAY = "gw-1"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(key: Ed25519PrivateKey, kid: str, payload: dict, header: dict | None = None) -> str:
    head = b64(json.dumps(header or {"alg": "EdDSA", "kid": kid}).encode())
    body = b64(json.dumps(payload).encode())
    return f"{head}.{body}.{b64(key.sign(f'{head}.{body}'.encode()))}"


def payload(seq: int = 1, **over: object) -> dict:
    base = {
        "iss": "stoa-cp",
        "aud": GATEWAY,
        "iat": NOW - 10,
        "exp": NOW + 590,
        "jti": f"j{seq}",
        "seq": seq,
        "grants": [
            {"grant_id": "g1", "tenant_id": "t", "tool": "read", "consumers": [], "scopes": ["tools:read"]},
            {"grant_id": "g2", "tenant_id": "t", "tool": "write", "consumers": ["alice"], "scopes": []},
        ],
        "revocations": [],
    }
    base.update(over)
    return base


@pytest.fixture
def keys():
    return {"k1": Ed25519PrivateKey.generate(), "k2": Ed25519PrivateKey.generate()}


@pytest.fixture
def perms(keys):
    clock = [float(NOW)]
    held = Permissions(
        {k: v.public_key() for k, v in keys.items()}, GATEWAY, "stoa-cp", clock=lambda: clock[0]
    )
    held.clock_value = clock  # type: ignore[attr-defined]
    return held


REVOKED = {"revocation_id": "r", "tenant_id": "t", "tool": "read", "consumer": ""}
ALICE = Caller("t", "mcp", "alice", frozenset())
READER = Caller("t", "mcp", "bob", frozenset({"tools:read"}))
OTHER_TENANT = Caller("u", "mcp", "alice", frozenset({"tools:read"}))


def test_nothing_is_allowed_before_an_artifact(perms):
    assert perms.not_enforceable() == "no_artifact"
    assert not perms.allows(READER, "read")


def test_grants_by_scope_and_by_consumer_within_the_tenant(perms, keys):
    perms.offer(sign(keys["k1"], "k1", payload()))
    assert perms.not_enforceable() is None
    assert perms.allows(READER, "read")
    assert not perms.allows(READER, "write")
    assert perms.allows(ALICE, "write")
    assert not perms.allows(ALICE, "read")
    assert not perms.allows(OTHER_TENANT, "read")


def test_revocation_overrides_grants_for_one_consumer_or_all(perms, keys):
    perms.offer(sign(keys["k1"], "k1", payload(1)))
    revoke_bob = [{"revocation_id": "r1", "tenant_id": "t", "tool": "read", "consumer": "bob"}]
    perms.offer(sign(keys["k1"], "k1", payload(2, revocations=revoke_bob)))
    assert not perms.allows(READER, "read")
    assert perms.allows(Caller("t", "mcp", "carol", frozenset({"tools:read"})), "read")
    revoke_all = [{"revocation_id": "r2", "tenant_id": "t", "tool": "write", "consumer": ""}]
    perms.offer(sign(keys["k1"], "k1", payload(3, revocations=revoke_all)))
    assert not perms.allows(ALICE, "write")


def test_expiry_is_never_extended(perms, keys):
    perms.offer(sign(keys["k1"], "k1", payload()))
    perms.clock_value[0] = NOW + 590
    assert perms.not_enforceable() == "artifact_expired"
    assert not perms.allows(READER, "read")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda k: sign(k["k1"], "k1", payload(), {"alg": "none", "kid": "k1"}), "alg 'none'"),
        (lambda k: sign(k["k1"], "k1", payload(), {"alg": "HS256", "kid": "k1"}), "alg 'HS256'"),
        (lambda k: sign(k["k1"], "k9", payload()), "kid 'k9'"),
        (lambda k: sign(k["k2"], "k1", payload()), "bad signature"),
        (lambda k: sign(k["k1"], "k1", payload(aud="gw-2")), "aud 'gw-2'"),
        (lambda k: sign(k["k1"], "k1", payload(iss="evil")), "iss 'evil'"),
        (lambda k: sign(k["k1"], "k1", payload(exp=NOW - 1)), "expired"),
        (lambda k: sign(k["k1"], "k1", payload(exp=NOW - 10 + 901)), "lifetime 901"),
        (lambda k: "a.b", "not a compact JWS"),
        # The contents are read by the one typed reader the CP signs with (stoa_proto.tool_permissions).
        (lambda k: sign(k["k1"], "k1", payload(seq="6")), "unreadable payload \\(seq"),
        (lambda k: sign(k["k1"], "k1", payload(6, iat=float(NOW))), "unreadable payload \\(iat"),
        (lambda k: sign(k["k1"], "k1", payload(True)), "unreadable payload \\(seq"),
        (lambda k: sign(k["k1"], "k1", payload(6, jti="")), "unreadable payload \\(jti"),
        (lambda k: sign(k["k1"], "k1", payload(6, grants={})), "unreadable payload \\(grants"),
        (
            lambda k: sign(k["k1"], "k1", payload(6, grants=[{"grant_id": "g", "tenant_id": "t"}])),
            "unreadable payload \\(grants.0.tool",
        ),
        (
            lambda k: sign(k["k1"], "k1", payload(6, revocations=[{**REVOKED, "consumer": 7}])),
            "unreadable payload \\(revocations.0.consumer",
        ),
    ],
)
def test_refused_artifacts_change_nothing(perms, keys, make, why):
    perms.offer(sign(keys["k1"], "k1", payload(5)))
    with pytest.raises(Refused, match=why):
        perms.offer(make(keys))
    assert perms.held is not None
    assert perms.held.claims.seq == 5


def test_tampered_payload_is_refused(perms, keys):
    good = sign(keys["k1"], "k1", payload(1))
    head, _, sig = good.split(".")
    forged = b64(
        json.dumps(
            payload(
                1,
                grants=[
                    {
                        "grant_id": "x",
                        "tenant_id": "t",
                        "tool": "write",
                        "consumers": ["mallory"],
                        "scopes": [],
                    }
                ],
            )
        ).encode()
    )
    with pytest.raises(Refused, match="bad signature"):
        perms.offer(f"{head}.{forged}.{sig}")
    assert perms.held is None


def test_rollback_and_replay_are_refused(perms, keys):
    perms.offer(sign(keys["k1"], "k1", payload(7)))
    with pytest.raises(Refused, match="rollback"):
        perms.offer(sign(keys["k1"], "k1", payload(6)))
    same = perms.held.jws
    perms.offer(same)  # the very same artifact again: no change
    with pytest.raises(Refused, match="replay"):
        perms.offer(sign(keys["k1"], "k1", payload(7, jti="other")))
    assert perms.held.claims.seq == 7


def test_both_keys_verify_during_a_rotation(perms, keys):
    perms.offer(sign(keys["k1"], "k1", payload(1)))
    perms.offer(sign(keys["k2"], "k2", payload(2)))
    assert perms.held.kid == "k2"


def test_what_the_cp_signs_is_what_the_module_reads(perms, keys):
    """The CP builds its payload with the same typed contents the module reads (one contract)."""
    claims = ToolPermissionClaims(
        iss="stoa-cp",
        aud=GATEWAY,
        iat=NOW,
        exp=NOW + 600,
        jti="j",
        seq=3,
        grants=(ToolGrant(grant_id="g", tenant_id="t", tool="read", scopes=("tools:read",)),),
        revocations=(ToolRevocation(revocation_id="r", tenant_id="t", tool="read", consumer="carol"),),
    )
    held = perms.offer(sign(keys["k1"], "k1", claims.payload()))
    assert held.claims == claims
    assert perms.allows(READER, "read")
    assert not perms.allows(Caller("t", "mcp", "carol", frozenset({"tools:read"})), "read")


def test_pinned_keys_file(tmp_path: Path, keys):
    x = b64(keys["k1"].public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": x}]}))
    assert set(load_pinned_keys(path)) == {"k1"}
    path.write_text(json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": x, "d": x}]}))
    with pytest.raises(ValueError, match="private"):
        load_pinned_keys(path)


async def test_a_budget_that_cannot_be_counted_refuses() -> None:
    """Fail closed: without a quota store a budgeted call is refused, never made uncounted."""
    from stoa_mcp.budgets import Budgets, BudgetUnavailable

    with pytest.raises(BudgetUnavailable):
        await Budgets("").spend(READER, "read", 10, 60)
