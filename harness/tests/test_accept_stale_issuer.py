"""An identity provider that stays unreachable: its keys are trusted for a bounded time only. Past the
CP's stale bound the issuer's keys leave the inventory (a new generation) and, at the gateway, its
tokens are refused with 401 invalid_token; the issuer shows `stale: true` and the CP counts it.

Through a real Envoy, with a bound of a few seconds (STOA_CP_ISSUER_STALE_AFTER_S)."""

from __future__ import annotations

from collections.abc import Callable

from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.metrics import scrape
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-stale"
STALE_AFTER_S = 4


def stale_issuers(estate: Estate) -> float:
    return scrape(estate.cp_url, timeout=5)["stoa_cp_stale_issuers"]


def test_keys_of_an_unreachable_issuer_stop_being_trusted_past_the_stale_bound(
    estates: Callable[..., Estate],
) -> None:
    options = EstateOptions(
        authz="service",
        authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE},
        cp_env={"STOA_CP_ISSUER_STALE_AFTER_S": str(STALE_AFTER_S), "STOA_CP_JWKS_REFRESH_S": "1"},
    )
    estate = estates(options, "estate-stale-issuer")
    with DevIdentityProvider(alg="RS256", audience=AUDIENCE) as idp:
        estate.admin.create_tenant("demo", exist_ok=True)
        estate.admin.add_issuer("demo", idp.issuer, idp.jwks_uri)
        generation = estate.publish("stale", tenant_id="demo", auth={"mode": "jwt", "scopes": []})
        estate.admin.wait_synced(generation)
        assert estate.site is not None
        estate.site.wait_authz_ready()
        token = idp.mint(tenant="demo", sub="someone", lifetime_s=600)
        path = estate.url("/apis/stale/x")
        headers = {"authorization": f"Bearer {token}"}
        assert estate.gateway.get(path, headers=headers).status_code == 200
        assert stale_issuers(estate) == 0
    # The identity provider is gone: its keys keep working until the bound, then leave.
    before = estate.admin.desired_generation()

    def issuer() -> dict | None:
        listed = estate.admin.issuers("demo")
        return listed[0] if listed and listed[0]["stale"] else None

    shown = wait_until(issuer, STALE_AFTER_S + 20, "the issuer to become stale")
    assert shown["last_error"]
    assert shown["last_fetched_at"] is not None
    assert estate.admin.desired_generation() > before
    estate.admin.wait_synced()
    refused = estate.gateway.get(path, headers=headers)
    assert refused.status_code == 401, refused.text
    assert refused.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert stale_issuers(estate) == 1
