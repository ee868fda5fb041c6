"""The signed tool permissions: verification, the one held, and the decision made from it.

Deny by default: nothing is allowed until a valid artifact is held, and nothing once it has expired
(it is never extended here; only a newer artifact from the CP renews). An artifact is refused unless
it is a compact JWS with `alg` EdDSA exactly, a `kid` among the pinned keys, a valid Ed25519
signature, this module's gateway as `aud`, the configured `iss`, a lifetime of at most 15 minutes,
not expired, and a `seq` above the one held (a lower one is a rollback; the same one is a replay
unless it is the very same artifact). A refused artifact changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from stoa_ops import policy_sets
from stoa_proto import tool_permissions
from stoa_proto.tool_permissions import ToolPermissionClaims

MAX_LIFETIME_S = 900
NO_ARTIFACT = "no_artifact"
ARTIFACT_EXPIRED = "artifact_expired"


class Refused(policy_sets.Refused):
    """An artifact that is not honoured; the message says why (it is NACKed with it)."""


def _b64decode(segment: str) -> bytes:
    if not segment or any(
        c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in segment
    ):
        raise Refused("not base64url")
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise Refused("not base64url") from None


def load_pinned_keys(path: Path) -> dict[str, Ed25519PublicKey]:
    """kid → public key, from a JWKS file of OKP Ed25519 keys (each with its kid)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the pinned keys {path}: {exc}") from None
    keys: dict[str, Ed25519PublicKey] = {}
    for i, jwk in enumerate(document.get("keys", []) if isinstance(document, dict) else []):
        if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            raise ValueError(f"{path}: keys[{i}] is not an OKP Ed25519 key")
        kid, x = jwk.get("kid"), jwk.get("x")
        if not isinstance(kid, str) or not kid or not isinstance(x, str):
            raise ValueError(f"{path}: keys[{i}] needs a kid and x")
        if "d" in jwk:
            raise ValueError(f"{path}: keys[{i}] is a private key; pin public keys only")
        try:
            keys[kid] = Ed25519PublicKey.from_public_bytes(_b64decode(x))
        except (Refused, ValueError):
            raise ValueError(f"{path}: keys[{i}].x is not an Ed25519 public key") from None
    if not keys:
        raise ValueError(f"{path} holds no key")
    return keys


@dataclass(frozen=True)
class Artifact:
    jws: str
    kid: str
    claims: ToolPermissionClaims


def verify(
    jws: str, keys: Mapping[str, Ed25519PublicKey], audience: str, issuer: str, now: float, skew_s: int = 30
) -> Artifact:
    """The artifact `jws` carries, or Refused naming why it is not honoured."""
    parts = jws.split(".")
    if len(parts) != 3:
        raise Refused("not a compact JWS")
    try:
        header = json.loads(_b64decode(parts[0]))
    except (Refused, ValueError):
        raise Refused("unreadable JWS header") from None
    if not isinstance(header, dict):
        raise Refused("unreadable JWS header")
    if header.get("alg") != "EdDSA":
        raise Refused(f"alg {header.get('alg')!r} is not EdDSA")
    if "crit" in header:
        raise Refused("critical header parameters are not understood")
    kid = header.get("kid")
    key = keys.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise Refused(f"kid {kid!r} is not a pinned key")
    try:
        key.verify(_b64decode(parts[2]), f"{parts[0]}.{parts[1]}".encode("ascii"))
    except (InvalidSignature, Refused):
        raise Refused("bad signature") from None
    try:
        claims = tool_permissions.read(_b64decode(parts[1]))
    except (Refused, tool_permissions.NotToolPermissions) as exc:
        raise Refused(f"unreadable payload ({exc})") from None
    if claims.iss != issuer:
        raise Refused(f"iss {claims.iss!r} is not {issuer!r}")
    if claims.aud != audience:
        raise Refused(f"aud {claims.aud!r} is not this gateway ({audience!r})")
    if claims.exp - claims.iat > MAX_LIFETIME_S or claims.exp <= claims.iat:
        raise Refused(f"lifetime {claims.exp - claims.iat} s is not within 1..{MAX_LIFETIME_S} s")
    if claims.iat > now + skew_s:
        raise Refused("issued in the future")
    if claims.exp <= now:
        raise Refused("expired")
    return Artifact(jws, kid, claims)


@dataclass(frozen=True)
class Caller:
    """Who calls, from the verified identity envelope only."""

    tenant_id: str
    api_id: str
    consumer: str
    scopes: frozenset[str]


@dataclass
class Permissions:
    """The artifact held, and the decisions made from it."""

    keys: Mapping[str, Ed25519PublicKey]
    audience: str
    issuer: str
    skew_s: int = 30
    clock: Callable[[], float] = time.time
    held: Artifact | None = None
    refusals: dict[str, int] = field(default_factory=dict)

    def offer(self, jws: str) -> Artifact:
        """Hold `jws` if it is valid and newer than the one held; Refused (nothing changes) otherwise."""
        try:
            artifact = verify(jws, self.keys, self.audience, self.issuer, self.clock(), self.skew_s)
            held = self.held
            if held is not None:
                if artifact.claims.seq < held.claims.seq:
                    raise Refused(
                        f"seq {artifact.claims.seq} is below the one held ({held.claims.seq}): a rollback"
                    )
                if artifact.claims.seq == held.claims.seq and artifact.jws != held.jws:
                    raise Refused(f"seq {artifact.claims.seq} is held already with other content: a replay")
        except Refused as exc:
            # The metric's label: the kind of refusal, without the values that vary.
            reason = str(exc).split(" ", 1)[0] if str(exc).startswith(("alg", "kid", "seq")) else str(exc)
            reason = reason.split(" (", 1)[0]
            self.refusals[reason] = self.refusals.get(reason, 0) + 1
            raise
        self.held = artifact
        return artifact

    def not_enforceable(self) -> str | None:
        """Why nothing can be allowed now (`no_artifact`, `artifact_expired`), or None."""
        if self.held is None:
            return NO_ARTIFACT
        if self.held.claims.exp <= self.clock():
            return ARTIFACT_EXPIRED
        return None

    def allows(self, caller: Caller, tool: str) -> bool:
        """The one grant decision: a grant of the caller's tenant names the tool and the caller (as a
        consumer or through a scope it holds), and no revocation of that tool covers the caller."""
        if self.not_enforceable() is not None:
            return False
        held = self.held
        assert held is not None
        for revocation in held.claims.revocations:
            if (
                revocation.tenant_id == caller.tenant_id
                and revocation.tool == tool
                and revocation.consumer in ("", caller.consumer)
            ):
                return False
        return any(
            g.tenant_id == caller.tenant_id
            and g.tool == tool
            and (caller.consumer in g.consumers or not caller.scopes.isdisjoint(g.scopes))
            for g in held.claims.grants
        )
