"""The console as the CP serves it: one page (also the sign-in callback) with a policy that lets it
load scripts and styles from the CP only and talk to the CP and the sign-in issuer only, its sign-in
settings, and files that name no address outside the machine. Its behaviour in a browser is tested
in harness/tests/test_accept_console.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import stoa_cp

STATIC = Path(stoa_cp.__file__).parent / "console"


@pytest.mark.parametrize("path", ["/console", "/console/", "/console/callback?code=x&state=y"])
async def test_the_page_is_served_without_a_credential_and_with_a_strict_policy(cp, idp, path):
    async with cp.client(None) as client:
        reply = await client.answer("GET", path)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    policy = reply.headers["content-security-policy"]
    assert "script-src 'self';" in policy
    assert f"connect-src 'self' {idp.issuer};" in policy
    assert "frame-ancestors 'none'" in policy
    assert reply.headers["referrer-policy"] == "no-referrer"
    assert '<script type="module" src="/console/static/app.js"></script>' in reply.text


async def test_the_sign_in_settings_name_the_issuer_and_the_claims(cp, idp):
    async with cp.client(None) as client:
        config = (await client.answer("GET", "/console/config.json")).json()
    assert config == {
        "issuer": idp.issuer,
        "client_id": "stoa-console",
        "roles_claim": "stoa_roles",
        "tenant_claim": "tenant_id",
    }


async def test_a_console_issuer_of_its_own_is_the_one_signed_in_at(cp_factory, idp):
    other = await cp_factory(oidc_issuers=[idp.issuer], console_issuer="http://127.0.0.1:1/idp")
    async with other.client(None) as client:
        assert (await client.answer("GET", "/console/config.json")).json()[
            "issuer"
        ] == "http://127.0.0.1:1/idp"
        policy = (await client.answer("GET", "/console")).headers["content-security-policy"]
    assert "connect-src 'self' http://127.0.0.1:1;" in policy


async def test_the_modules_are_served_as_javascript_and_the_page_is_not_in_the_api_document(cp):
    async with cp.client(None) as client:
        script = await client.answer("GET", "/console/static/app.js")
        spec = (await client.answer("GET", "/openapi.json")).json()
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert not [p for p in spec["paths"] if p.startswith("/console")]


def test_no_console_file_names_an_address_outside_the_machine():
    files = [p for p in STATIC.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"index.html", "app.js", "auth.js", "api.js", "forms.js", "console.css"}
    for path in files:
        text = path.read_text()
        assert not re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), path
        assert "@import" not in text, path
