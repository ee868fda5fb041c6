"""Which trusted-issuer keys a site verifies tokens with: one rule for the CP (at the write and at
each refresh) and the authorization service (when it loads a policy set or refreshes an issuer).

A key set is accepted when every key meant for verifying is a public RSA (2048 bits or more), EC
(P-256, P-384) or OKP (Ed25519) key with a unique `kid`, whose declared `alg` (if any) fits it; keys
for something else (`use` other than `sig`, `key_ops` without `verify`) are left aside. Symmetric
keys, private key material and other curves are refused, so a key set the CP accepts never makes a
site refuse its policy set.

Also the other side, the Ed25519 keys STOA signs with (the CP its tool permissions, stoa-authz its
identity envelope): one reader of their PEM files, the public JWK a verifier pins, and the compact
JWS (RFC 7515, EdDSA per RFC 8037) both sign.
"""

from __future__ import annotations

import base64
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc.errors import JoseError, SecurityWarning
from joserfc.jwk import ECKey, OKPKey, RSAKey, import_key

# "EdDSA" is the alg STOA signs with and its verifiers require (what they understand today); joserfc
# warns that RFC 9864 supersedes the name.
warnings.filterwarnings("ignore", message="EdDSA is deprecated", category=SecurityWarning)

PublicKey = RSAKey | ECKey | OKPKey

KEY_TYPES = ("RSA", "EC", "OKP")
RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
# Algorithms a key may verify, by key type and curve. No "none", no HMAC: symmetric keys never load.
EC_ALGORITHMS = {"P-256": frozenset({"ES256"}), "P-384": frozenset({"ES384"})}
OKP_ALGORITHMS = {"Ed25519": frozenset({"EdDSA", "Ed25519"})}
# Members only a private (or symmetric) key carries; a site must never receive them.
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
MIN_RSA_BITS = 2048
MAX_KEYS = 64
MAX_JWKS_BYTES = 512 * 1024


class KeySetError(ValueError):
    """A key set the rule refuses; `path` names the member at fault (`keys[1].crv`), empty for the
    document as a whole."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


@dataclass(frozen=True, slots=True)
class VerificationKey:
    key: PublicKey
    algorithms: frozenset[str]


def for_verifying(member: Mapping[str, Any]) -> bool:
    key_ops = member.get("key_ops")
    if key_ops is not None and (not isinstance(key_ops, list) or "verify" not in key_ops):
        return False
    return member.get("use", "sig") == "sig"


def verification_key(member: object, path: str) -> tuple[str, VerificationKey]:
    """(kid, key) of one JWKS member meant for verifying; KeySetError naming what is wrong."""
    if not isinstance(member, dict):
        raise KeySetError(path, "a key must be a JSON object")
    kty = member.get("kty")
    if kty == "oct":
        raise KeySetError(f"{path}.kty", "symmetric key (oct) refused: publish public keys only")
    if kty not in KEY_TYPES:
        raise KeySetError(f"{path}.kty", f"must be one of {', '.join(KEY_TYPES)} (public keys only)")
    private = [name for name in PRIVATE_MEMBERS if name in member]
    if private:
        raise KeySetError(f"{path}.{private[0]}", "private key material refused: publish public keys only")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            key = import_key(member)
    except (JoseError, ValueError, TypeError) as exc:
        raise KeySetError(path, f"is not a usable {kty} public key: {exc}") from None
    if key.is_private:
        raise KeySetError(path, "private key material refused: publish public keys only")
    if isinstance(key, RSAKey):
        if key.raw_value.key_size < MIN_RSA_BITS:  # type: ignore[union-attr]
            raise KeySetError(path, f"RSA key shorter than {MIN_RSA_BITS} bits")
        algorithms = RSA_ALGORITHMS
    else:
        by_curve = EC_ALGORITHMS if isinstance(key, ECKey) else OKP_ALGORITHMS
        algorithms = by_curve.get(member.get("crv", ""), frozenset())
        if not algorithms:
            raise KeySetError(
                f"{path}.crv", f"unsupported curve {member.get('crv')!r} (supported: {', '.join(by_curve)})"
            )
    declared = member.get("alg")
    if declared is not None:
        if declared not in algorithms:
            raise KeySetError(f"{path}.alg", f"algorithm {declared!r} does not fit the key")
        algorithms = frozenset({declared})
    kid = member.get("kid")
    if not isinstance(kid, str) or not kid:
        raise KeySetError(f"{path}.kid", "is required (a non-empty string)")
    return kid, VerificationKey(key, algorithms)  # type: ignore[arg-type]


def verification_keys(document: object) -> dict[str, VerificationKey]:
    """The keys of a JWKS document (`{"keys": [...]}`) to verify tokens with, by kid."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise KeySetError("", "must be a JSON object with a 'keys' list")
    members = document["keys"]
    if len(members) > MAX_KEYS:
        raise KeySetError("keys", f"must hold at most {MAX_KEYS} keys")
    keys: dict[str, VerificationKey] = {}
    for index, member in enumerate(members):
        if isinstance(member, dict) and not for_verifying(member):
            continue  # encryption keys are not for verifying tokens
        kid, key = verification_key(member, f"keys[{index}]")
        if kid in keys:
            raise KeySetError(f"keys[{index}].kid", f"duplicate kid {kid!r}")
        keys[kid] = key
    return keys


def verification_keys_json(text: str) -> dict[str, VerificationKey]:
    """`verification_keys` of a JWKS document as JSON text."""
    if len(text) > MAX_JWKS_BYTES:
        raise KeySetError("", f"exceeds {MAX_JWKS_BYTES} bytes")
    try:
        document = json.loads(text)
    except ValueError:
        raise KeySetError("", "is not JSON") from None
    return verification_keys(document)


def accept(document: object, *, needs_a_key: bool) -> dict[str, Any]:
    """A key set as the CP stores it: the document unchanged when the site will accept it.

    `needs_a_key`: an issuer with keys only (no jwks_uri to fetch more from) must hold at least one
    key for verifying, or every one of its tokens would be refused."""
    keys = verification_keys(document)
    if needs_a_key and not keys:
        raise KeySetError("keys", "holds no key usable for verifying signatures")
    assert isinstance(document, dict)
    return document


def key_ids(jwks_json: str) -> tuple[str, ...]:
    """The key ids of an inline key set, sorted; () when a key names none (or the set is unreadable):
    a token may then be verified by a key no id tells apart."""
    try:
        keys = json.loads(jwks_json).get("keys", []) if jwks_json else []
    except (ValueError, AttributeError):
        return ()
    ids = [key.get("kid") if isinstance(key, dict) else None for key in keys]
    if not ids or not all(isinstance(kid, str) and kid for kid in ids):
        return ()
    return tuple(sorted(set(ids)))  # type: ignore[arg-type]


class SigningKeyError(ValueError):
    """A signing key file that cannot be used; the message names the file."""


def signing_key(pem: bytes) -> OKPKey:
    """The Ed25519 private key of an unencrypted PEM file; ValueError saying what else it is."""
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError("is not an unencrypted PEM private key") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise ValueError("is not an Ed25519 key")
    return OKPKey.import_key(pem)


def new_signing_key() -> bytes:
    """A fresh Ed25519 private key, as the PEM `signing_key` reads."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def signing_jwk(key: OKPKey) -> dict[str, Any]:
    """The public JWK of a signing key, with its kid (the RFC 7638 thumbprint): what a verifier pins."""
    return {**key.as_dict(private=False), "kid": key.thumbprint(), "alg": "EdDSA", "use": "sig"}


def read_signing_key(path: Path) -> OKPKey:
    """`signing_key` of a PEM file; SigningKeyError naming the file and what is wrong with it."""
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read signing key {path}: {exc.strerror}") from exc
    try:
        return signing_key(pem)
    except ValueError as exc:
        raise SigningKeyError(f"signing key {path} {exc}") from exc


def b64url(data: bytes) -> bytes:
    """base64url without padding, as JWS segments are written."""
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def header_segment(kid: str, typ: str) -> bytes:
    """The protected header of an EdDSA compact JWS, encoded, with the dot the payload follows."""
    header = {"alg": "EdDSA", "typ": typ, "kid": kid}
    return b64url(json.dumps(header, separators=(",", ":")).encode()) + b"."


def sign_compact(key: Ed25519PrivateKey, header: bytes, payload: bytes) -> str:
    """The compact JWS of `payload` (JSON bytes) under `header` (from `header_segment`)."""
    signing_input = header + b64url(payload)
    return (signing_input + b"." + b64url(key.sign(signing_input))).decode("ascii")
