"""The decision phases, table-driven: each reason from a request a user could send."""

from __future__ import annotations

import base64
import io
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from joserfc import jws
from joserfc.jwk import OKPKey, RSAKey, import_key
from stoa_authz.check import Decider, DecisionConfig
from stoa_authz.envelope import Envelope
from stoa_authz.identify import Identifier
from stoa_authz.log import DecisionLog
from stoa_authz.policy import PolicyStore, compile_policy_set
from stoa_authz.reasons import Reason
from stoa_harness.idp import DevIdentityProvider
from stoa_proto import authz_pb2, inventory_pb2
from stoa_proto.bodies import DENY_BODIES
from stoa_translate.policy_set import route_version

AUD = "stoa-test"  # the conftest's audience


class RecordedLog(DecisionLog):
    """A decision log writing to memory; `events()` flushes and parses what was written."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()
        super().__init__(self.buffer)

    def events(self) -> list[dict]:
        self.flush()
        return [json.loads(line) for line in self.buffer.getvalue().splitlines()]


def make_decider(
    idp, policy, audience=AUD, required=frozenset(), versions=("v1",), identifier=None
) -> tuple[Decider, Envelope, RecordedLog]:
    """A Decider on the policy sets `policy(idp, version)`; also its envelope and its decision log."""
    store = PolicyStore()
    for version in versions:
        store.add(compile_policy_set(policy(idp, version)))
    envelope = Envelope(OKPKey.generate_key("Ed25519"), "stoa-ext-authz")
    log = RecordedLog()
    decider = Decider(
        DecisionConfig(audience, frozenset(required)),
        store,
        identifier or Identifier(audience, "tenant_id"),
        envelope,
        log,
    )
    return decider, envelope, log


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def headers_of(response) -> dict[str, str]:
    section = response.ok_response if response.HasField("ok_response") else response.denied_response
    return {h.header.key: h.header.value for h in section.headers}


GOOD = {"tenant": "acme", "scope": "orders:read"}
STRANGER = RSAKey.generate_key(2048)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _repeating(members: dict, repeated: tuple[str, object] | None) -> bytes:
    """`members` as a JSON object, with a second member named `repeated[0]` last when given."""
    text = json.dumps(members)
    if repeated is not None:
        text = f"{text[:-1]}, {json.dumps(repeated[0])}: {json.dumps(repeated[1])}}}"
    return text.encode()


def raw_rs256(
    idp,
    header: dict,
    claims: dict,
    key: RSAKey | None = None,
    repeated_claim: tuple[str, object] | None = None,
    repeated_header: tuple[str, object] | None = None,
) -> str:
    """RS256 with the IdP's kid, signed without the JOSE library (which refuses to produce some of
    these headers, and repeated members): by the IdP's key unless another `key` is given."""
    head = _repeating({"alg": "RS256", "kid": idp.kid, **header}, repeated_header)
    signing_input = f"{b64(head)}.{b64(_repeating(claims, repeated_claim))}"
    signature = (key or idp.signing_key).private_key.sign(
        signing_input.encode(), padding.PKCS1v15(), hashes.SHA256()
    )
    return f"{signing_input}.{b64(signature)}"


# (case id, request builder(idp) -> CheckRequest, expected reason, expected HTTP status or None for allow)
CASES = [
    ("allowed", lambda i, r: r(bearer(i.mint(**GOOD))), Reason.ALLOWED, None),
    (
        "scp-list",
        lambda i, r: r(bearer(i.mint(tenant="acme", scope=None, scp=["orders:read"]))),
        Reason.ALLOWED,
        None,
    ),
    (
        "scp-string",
        lambda i, r: r(bearer(i.mint(tenant="acme", scope=None, scp="a orders:read"))),
        Reason.ALLOWED,
        None,
    ),
    (
        "aud-list",
        lambda i, r: r(bearer(i.mint(audience=["x", AUD], **GOOD))),
        Reason.ALLOWED,
        None,
    ),
    ("auth-none", lambda i, r: r(route_id="open", api_id="open"), Reason.ALLOWED, None),
    ("no-header", lambda i, r: r(), Reason.MISSING_TOKEN, 401),
    ("basic-scheme", lambda i, r: r({"authorization": "Basic dTpw"}), Reason.MISSING_TOKEN, 401),
    (
        "lower-case-scheme",
        lambda i, r: r({"authorization": f"bearer {i.mint(**GOOD)}"}),
        Reason.ALLOWED,
        None,
    ),
    # The scheme in the spellings Envoy's jwt_authn also takes, so both placements answer alike.
    (
        "mixed-case-scheme",
        lambda i, r: r({"authorization": f"BeArEr {i.mint(**GOOD)}"}),
        Reason.MISSING_TOKEN,
        401,
    ),
    ("garbage", lambda i, r: r(bearer("not-a-jwt")), Reason.INVALID_TOKEN, 401),
    ("bad-signature", lambda i, r: r(bearer(i.bad_signature(**GOOD))), Reason.INVALID_TOKEN, 401),
    ("alg-none", lambda i, r: r(bearer(i.alg_none(**GOOD))), Reason.INVALID_TOKEN, 401),
    (
        "hs256-public-key",
        lambda i, r: r(bearer(i.hs256_with_public_key(**GOOD))),
        Reason.INVALID_TOKEN,
        401,
    ),
    ("not-yet-valid", lambda i, r: r(bearer(i.not_yet_valid(**GOOD))), Reason.INVALID_TOKEN, 401),
    ("no-exp", lambda i, r: r(bearer(i.mint(exp=None, **GOOD))), Reason.INVALID_TOKEN, 401),
    (
        "unknown-kid",
        lambda i, r: r(bearer(i.sign(i.claims(**GOOD), {"kid": "nope"}))),
        Reason.INVALID_TOKEN,
        401,
    ),
    ("expired", lambda i, r: r(bearer(i.expired(**GOOD))), Reason.EXPIRED_TOKEN, 401),
    ("other-issuer", lambda i, r: r(bearer(i.other_issuer(**GOOD))), Reason.WRONG_ISSUER, 401),
    ("no-iss", lambda i, r: r(bearer(i.mint(iss=None, **GOOD))), Reason.WRONG_ISSUER, 401),
    ("wrong-audience", lambda i, r: r(bearer(i.wrong_audience(**GOOD))), Reason.WRONG_AUDIENCE, 401),
    (
        "no-audience",
        lambda i, r: r(bearer(i.sign({k: v for k, v in i.claims(**GOOD).items() if k != "aud"}))),
        Reason.WRONG_AUDIENCE,
        401,
    ),
    (
        "other-tenant",
        lambda i, r: r(bearer(i.mint(tenant="globex", scope="orders:read"))),
        Reason.TENANT_MISMATCH,
        403,
    ),
    (
        "no-tenant-claim",
        lambda i, r: r(bearer(i.mint(tenant=None, scope="orders:read"))),
        Reason.TENANT_MISMATCH,
        403,
    ),
    (
        "missing-scope",
        lambda i, r: r(bearer(i.mint(tenant="acme", scope="orders:write"))),
        Reason.INSUFFICIENT_SCOPE,
        403,
    ),
    (
        "duplicate-authorization",
        lambda i, r: r({"authorization": "Bearer a.b.c,Bearer d.e.f"}),
        Reason.MALFORMED_REQUEST,
        400,
    ),
    (
        "duplicate-api-key",
        lambda i, r: r({"x-api-key": "k1,k2", **bearer(i.mint(**GOOD))}),
        Reason.MALFORMED_REQUEST,
        400,
    ),
    (
        "crlf",
        lambda i, r: r({"x-note": "a\r\nx-stoa-tenant-id: acme"}),
        Reason.MALFORMED_REQUEST,
        400,
    ),
    ("nul", lambda i, r: r({"x-note": "a\x00b"}), Reason.MALFORMED_REQUEST, 400),
    # A valid signature by the trusted key, but a critical extension nobody implements.
    (
        "crit-b64",
        lambda i, r: r(bearer(raw_rs256(i, {"crit": ["b64"], "b64": True}, i.claims(**GOOD)))),
        Reason.INVALID_TOKEN,
        401,
    ),
    (
        "crit-empty",
        lambda i, r: r(bearer(raw_rs256(i, {"crit": []}, i.claims(**GOOD)))),
        Reason.INVALID_TOKEN,
        401,
    ),
    # Keys the token carries or points at are never used: only the delivered JWKS verifies.
    (
        "embedded-jwk",
        lambda i, r: r(
            bearer(raw_rs256(i, {"jwk": STRANGER.as_dict(private=False)}, i.claims(**GOOD), STRANGER))
        ),
        Reason.INVALID_TOKEN,
        401,
    ),
    (
        "jku-x5u",
        lambda i, r: r(
            bearer(
                raw_rs256(
                    i,
                    {"jku": "http://127.0.0.1:9/k", "x5u": "http://127.0.0.1:9/c"},
                    i.claims(**GOOD),
                    STRANGER,
                )
            )
        ),
        Reason.INVALID_TOKEN,
        401,
    ),
    (
        "exp-beyond-any-date",
        lambda i, r: r(bearer(raw_rs256(i, {}, {**i.claims(**GOOD), "exp": 10**400}))),
        Reason.INVALID_TOKEN,
        401,
    ),
    (
        "deeply-nested-payload",
        lambda i, r: r(bearer(f"{b64(b'{}')}.{b64(b'[' * 5000 + b']' * 5000)}.c2ln")),
        Reason.INVALID_TOKEN,
        401,
    ),
    (
        "bad-base64",
        lambda i, r: r(bearer("!!!." + i.mint(**GOOD).split(".", 1)[1])),
        Reason.INVALID_TOKEN,
        401,
    ),
    (
        "non-json-header",
        lambda i, r: r(bearer(b64(b"x{") + "." + i.mint(**GOOD).split(".", 1)[1])),
        Reason.INVALID_TOKEN,
        401,
    ),
    ("very-long-token", lambda i, r: r(bearer(i.mint(**GOOD, pad="x" * 20_000))), Reason.INVALID_TOKEN, 401),
    (
        "iss-not-exact",
        lambda i, r: r(bearer(i.mint(iss=i.issuer + "/", **GOOD))),
        Reason.WRONG_ISSUER,
        401,
    ),
    ("no-sub", lambda i, r: r(bearer(i.mint(sub=None, **GOOD))), Reason.INVALID_TOKEN, 401),
    ("empty-sub", lambda i, r: r(bearer(i.mint(sub="", **GOOD))), Reason.INVALID_TOKEN, 401),
    ("sub-not-a-string", lambda i, r: r(bearer(i.mint(sub=7, **GOOD))), Reason.INVALID_TOKEN, 401),
    # A sub is copied into x-stoa-subject: a control character in it is a bad token, not a 503.
    *(
        (
            f"sub-{name}",
            lambda i, r, ch=ch: r(bearer(i.mint(sub=f"a{ch}x-stoa-tenant-id: acme", **GOOD))),
            Reason.INVALID_TOKEN,
            401,
        )
        for name, ch in (("cr", "\r"), ("lf", "\n"), ("crlf", "\r\n"), ("nul", "\x00"))
    ),
    # ... and it must arrive unchanged: no space at either end (trimmed: " admin" is "admin" to an
    # upstream), nothing beyond ASCII (read as Latin-1), nor a Unicode line separator or format
    # character.
    *(
        (f"sub-{name}", lambda i, r, sub=sub: r(bearer(i.mint(sub=sub, **GOOD))), Reason.INVALID_TOKEN, 401)
        for name, sub in (
            ("leading-space", " admin"),
            ("trailing-space", "admin "),
            ("tab", "ad\tmin"),
            ("not-ascii", "client-\u00e9"),
            ("no-break-space", "admin\u00a0"),
            ("line-separator", "a\u2028b"),
            ("right-to-left-override", "a\u202eb"),
        )
    ),
    # A repeated member means different things to different JSON parsers: refused, as Envoy does.
    *(
        (
            f"repeated-{name}",
            lambda i, r, claims=claims, repeated=repeated: r(
                bearer(raw_rs256(i, {}, i.claims(**claims), repeated_claim=repeated))
            ),
            Reason.INVALID_TOKEN,
            401,
        )
        for name, claims, repeated in (
            ("tenant-ours-last", {**GOOD, "tenant": "other"}, ("tenant_id", "acme")),
            ("tenant-ours-first", GOOD, ("tenant_id", "other")),
            ("sub", GOOD, ("sub", "admin")),
        )
    ),
    (
        "repeated-header-kid",
        lambda i, r: r(
            bearer(raw_rs256(i, {"kid": "nope"}, i.claims(**GOOD), repeated_header=("kid", i.kid)))
        ),
        Reason.INVALID_TOKEN,
        401,
    ),
    # A good token minted with one claim or lifetime changed.
    *(
        (name, lambda i, r, minted=minted: r(bearer(i.mint(**minted, **GOOD))), reason, status)
        for name, minted, reason, status in (
            ("sub-inner-space", {"sub": "service account 7"}, Reason.ALLOWED, None),
            ("lifetime-above-maximum", {"lifetime_s": 86_400 + 120}, Reason.INVALID_TOKEN, 401),
            (
                "no-iat-expiring-beyond-maximum",
                {"iat": None, "lifetime_s": 86_400 + 120},
                Reason.INVALID_TOKEN,
                401,
            ),
            ("no-iat-within-maximum", {"iat": None}, Reason.ALLOWED, None),
            ("lifetime-at-maximum", {"lifetime_s": 86_400}, Reason.ALLOWED, None),
        )
    ),
    # A good token on a request that differs in one field.
    *(
        (name, lambda i, r, change=change: r(bearer(i.mint(**GOOD)), **change), reason, status)
        for name, change, reason, status in (
            ("hidden-dot-segment", {"path": "/apis/orders/%252e%252e;/admin"}, Reason.MALFORMED_REQUEST, 400),
            ("matrix-parameter", {"path": "/apis/orders/a;v=1/b"}, Reason.ALLOWED, None),
            ("unknown-route", {"route_id": "ghost"}, Reason.UNKNOWN_ROUTE, 403),
            ("route-tenant-differs", {"tenant_id": "globex"}, Reason.UNKNOWN_ROUTE, 403),
            # A route entry no kept set holds: its Envoy route was built with a set no longer held.
            ("unknown-version", {"version": "0123456789abcdef"}, Reason.POLICY_UNAVAILABLE, 503),
        )
    ),
]


@pytest.mark.parametrize(("build", "reason", "status"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_decision(idp, req, policy, build, reason, status):
    decider, _, log = make_decider(idp, policy)
    response = decider.decide(build(idp, req))
    events = log.events()
    assert [e["reason"] for e in events] == [reason.value]
    assert [(e["event"], e["logger"], e["decision"]) for e in events] == [
        ("ext_authz_decision", "stoa_authz.decision", "deny" if status else "allow")
    ]
    if status is None:
        assert response.status.code == 0
        assert response.HasField("ok_response")
    else:
        assert response.status.code != 0
        assert response.denied_response.status.code == status
        assert response.denied_response.body.encode() == DENY_BODIES[status]
        assert headers_of(response)["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("token_kind", "challenge"),
    [
        (None, "Bearer"),
        ("bad_signature", 'Bearer error="invalid_token"'),
        ("scope", 'Bearer error="insufficient_scope"'),
    ],
)
async def test_www_authenticate(idp, req, policy, token_kind, challenge):
    decider, _, _ = make_decider(idp, policy)
    headers = {}
    if token_kind == "bad_signature":
        headers = bearer(idp.bad_signature(**GOOD))
    elif token_kind == "scope":
        headers = bearer(idp.mint(tenant="acme", scope="other"))
    response = decider.decide(req(headers))
    assert headers_of(response)["www-authenticate"] == challenge


async def test_no_audience_denies_everything(idp, req, policy):
    decider, _, _ = make_decider(idp, policy, audience="")
    for request in (req(bearer(idp.mint(**GOOD))), req(route_id="open", api_id="open")):
        response = decider.decide(request)
        assert response.denied_response.status.code == 503
    assert DENY_BODIES[503] == DENY_BODIES[403]


async def test_global_required_scopes(idp, req, policy):
    decider, _, _ = make_decider(idp, policy, required={"platform"})
    denied = decider.decide(req(bearer(idp.mint(**GOOD))))
    assert denied.denied_response.status.code == 403
    allowed = decider.decide(req(bearer(idp.mint(tenant="acme", scope="orders:read platform"))))
    assert allowed.HasField("ok_response")


async def test_allow_sets_identity_and_removes_forged_headers(idp, req, policy):
    decider, envelope, _ = make_decider(idp, policy)
    forged = {
        "x-stoa-tenant-id": "evil",
        "x-user-id": "root",
        "x-tenant-id": "evil",
        "x-auth-role": "admin",
        "x-forwarded-user": "root",
        "x-stoa-debug": "1",
    }
    token = idp.mint(tenant="acme", scope="orders:read extra", sub="client-42")
    response = decider.decide(req({**bearer(token), **forged}, request_id="req-77"))
    ok = response.ok_response
    set_headers = headers_of(response)
    assert set_headers["x-stoa-tenant-id"] == "acme"
    assert set_headers["x-stoa-api-id"] == "orders"
    assert set_headers["x-stoa-subject"] == "client-42"
    assert all(h.append_action == h.OVERWRITE_IF_EXISTS_OR_ADD for h in ok.headers)
    # Forged names we overwrite are not also removed (that would drop our own value).
    assert sorted(ok.headers_to_remove) == [
        "x-auth-role",
        "x-forwarded-user",
        "x-stoa-debug",
        "x-tenant-id",
        "x-user-id",
    ]
    public = import_key(json.loads(envelope.jwks)["keys"][0])
    jws_token = jws.deserialize_compact(set_headers["x-stoa-identity"], public, algorithms=["EdDSA"])
    assert jws_token.protected["kid"] == envelope.kid
    claims = json.loads(jws_token.payload)
    assert claims["tenant"] == "acme"
    assert claims["api"] == "orders"
    assert claims["sub"] == "client-42"
    assert claims["scopes"] == ["extra", "orders:read"]
    assert claims["request_id"] == "req-77"
    assert claims["exp"] - claims["iat"] == 60


async def test_auth_none_route_strips_but_sets_no_subject(idp, req, policy):
    decider, _, _ = make_decider(idp, policy)
    response = decider.decide(
        req({"x-stoa-subject": "forged", "X-User-Id": "root"}, route_id="open", api_id="open")
    )
    assert headers_of(response) == {"x-stoa-tenant-id": "acme", "x-stoa-api-id": "open"}
    assert sorted(response.ok_response.headers_to_remove) == ["x-stoa-subject", "x-user-id"]


async def test_raw_header_map_duplicates(idp, req, policy):
    decider, _, log = make_decider(idp, policy)
    token = idp.mint(**GOOD)
    request = req()
    request.attributes.request.http.headers.clear()
    for name in ("authorization", "Authorization"):
        entry = request.attributes.request.http.header_map.headers.add()
        entry.key, entry.raw_value = name, f"Bearer {token}".encode()
    response = decider.decide(request)
    assert response.denied_response.status.code == 400
    assert [e["reason"] for e in log.events()] == ["malformed_request"]


async def test_cached_token_expires(idp, req, policy):
    now = [1_000_000.0]
    store = PolicyStore()
    store.add(compile_policy_set(policy(idp)))
    identifier = Identifier(AUD, "tenant_id", clock=lambda: now[0])
    decider = Decider(
        DecisionConfig(AUD, frozenset()),
        store,
        identifier,
        Envelope(OKPKey.generate_key("Ed25519"), "x"),
        RecordedLog(),
    )
    token = idp.sign({**idp.claims(**GOOD), "iat": int(now[0]), "nbf": int(now[0]), "exp": int(now[0]) + 60})
    assert decider.decide(req(bearer(token))).HasField("ok_response")
    assert len(store.get("v1").decisions) == 1
    now[0] += 600
    assert decider.decide(req(bearer(token))).denied_response.status.code == 401
    assert len(store.get("v1").decisions) == 0


class BrokenIdentifier(Identifier):
    """An identifier with a bug: whatever it is asked, it raises."""

    def identify(self, token, route):
        raise RuntimeError("secret-ish detail")


async def test_internal_error_fails_closed(idp, req, policy):
    decider, _, log = make_decider(idp, policy, identifier=BrokenIdentifier(AUD, "tenant_id"))
    response = decider.decide(req(bearer(idp.mint(**GOOD))))
    assert response.denied_response.status.code == 503
    assert [e["reason"] for e in log.events()] == ["internal_error"]


@pytest.mark.parametrize("raw", [False, True], ids=["headers", "header_map"])
async def test_request_id_is_the_forwarded_x_request_id(idp, req, policy, raw):
    """Envoy's `http.id` is its stream id; the upstream and Envoy's logs know the x-request-id."""
    decider, envelope, log = make_decider(idp, policy)
    request = req({**bearer(idp.mint(**GOOD)), "x-request-id": "rid-5"}, request_id="4711")
    if raw:
        http = request.attributes.request.http
        for name, value in http.headers.items():
            entry = http.header_map.headers.add()
            entry.key, entry.raw_value = name, value.encode()
        http.headers.clear()
    response = decider.decide(request)
    public = import_key(json.loads(envelope.jwks)["keys"][0])
    identity = jws.deserialize_compact(headers_of(response)["x-stoa-identity"], public, algorithms=["EdDSA"])
    assert json.loads(identity.payload)["request_id"] == "rid-5"
    assert [e["request_id"] for e in log.events()] == ["rid-5"]


async def test_keys_of_another_tenant_and_cached_allows_stay_on_their_route(idp, req, policy):
    """globex trusts its own IdP: its tokens (or its key under acme's issuer name) never pass on an
    acme route; a token allowed (and cached) on `orders` is still decided afresh on `admin`."""
    other = DevIdentityProvider(alg="RS256", audience=AUD)
    globex = "https://globex.example"  # its own issuer: unstarted IdPs share one base URL

    admin = authz_pb2.AuthzRoute(route_id="admin", tenant_id="acme", api_id="admin", scopes=["orders:admin"])

    def two_tenants(i, version):
        message = policy(i, version)
        message.routes.append(admin)
        message.issuers.append(
            inventory_pb2.TrustedIssuer(tenant_id="globex", issuer=globex, jwks_json=json.dumps(other.jwks()))
        )
        return message

    decider, _, log = make_decider(idp, two_tenants)
    foreign = other.mint(iss=globex, **GOOD)
    spoofed = other.sign({**other.claims(**GOOD), "iss": idp.issuer})
    token = idp.mint(**GOOD)
    outcomes = [
        decider.decide(req(bearer(foreign))),
        decider.decide(req(bearer(spoofed))),
        decider.decide(req(bearer(token))),
        decider.decide(req(bearer(token), route_id="admin", api_id="admin", version=route_version(admin))),
    ]
    assert [e["reason"] for e in log.events()] == [
        "wrong_issuer",
        "invalid_token",
        "allowed",
        "insufficient_scope",
    ]
    assert outcomes[3].denied_response.status.code == 403


def with_verified_payload(request, claims: dict, namespace: str = "envoy.filters.http.jwt_authn"):
    """The request as Envoy sends it after jwt_authn verified a token: no authorization header
    (not forwarded), the payload in the Check's metadata_context under the filter's namespace."""
    request.attributes.metadata_context.filter_metadata[namespace].update({"payload": claims})
    return request


class NeverVerifies(Identifier):
    def identify(self, token, route):
        raise AssertionError("the service verified a token Envoy had verified")


async def test_envoy_verified_route_reads_the_payload_and_never_verifies(idp, req, verified_policy):
    decider, _, log = make_decider(idp, verified_policy, identifier=NeverVerifies(AUD, "tenant_id"))
    claims = idp.claims(tenant="acme", scope="orders:read", sub="client-9")
    allowed = decider.decide(
        with_verified_payload(
            req({"x-stoa-identity": "forged"}, route_id="verified", api_id="verified"), claims
        )
    )
    headers = headers_of(allowed)
    assert headers["x-stoa-subject"] == "client-9"
    assert headers["x-stoa-tenant-id"] == "acme"
    # No envelope on this route: a forged one is removed, none is minted.
    assert "x-stoa-identity" not in headers
    assert list(allowed.ok_response.headers_to_remove) == ["x-stoa-identity"]
    for other in ({"tenant_id": "globex"}, {"scope": "x"}):
        denied = decider.decide(
            with_verified_payload(req(route_id="verified", api_id="verified"), {**claims, **other})
        )
        assert denied.denied_response.status.code == 403
    assert [e["reason"] for e in log.events()] == ["allowed", "tenant_mismatch", "insufficient_scope"]


async def test_envoy_verified_route_trusts_only_jwt_authn_namespace(idp, req, verified_policy):
    """A payload anywhere else (another filter's namespace) is not a verified token, and a token in
    the headers is not looked at: without jwt_authn's payload the route fails closed."""
    decider, _, log = make_decider(idp, verified_policy)
    claims = idp.claims(tenant="acme", scope="orders:read")
    for request in (
        with_verified_payload(req(route_id="verified", api_id="verified"), claims, namespace="some.filter"),
        req(bearer(idp.mint(**GOOD)), route_id="verified", api_id="verified"),
    ):
        assert decider.decide(request).denied_response.status.code == 503
    assert [e["reason"] for e in log.events()] == ["internal_error"] * 2


async def test_payload_is_ignored_where_the_service_verifies(idp, req, policy):
    """On a route whose token the service verifies, a payload in the metadata changes nothing."""
    decider, _, _ = make_decider(idp, policy)
    claims = idp.claims(tenant="acme", scope="orders:read")
    assert decider.decide(with_verified_payload(req(), claims)).denied_response.status.code == 401
