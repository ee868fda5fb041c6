"""The published OpenAPI document tells the truth: schemathesis, run against `/openapi.json` as a new
user would run it, with every check, a fixed seed and a bounded number of examples, finds nothing."""

from __future__ import annotations

import asyncio
import os
import typing
import uuid
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel, ValidationError
from stoa_cp import schemas
from stoa_harness.cp_client import AsyncCPClient
from stoa_harness.ports import free_port
from stoa_harness.site import console_script
from stoa_harness.wait import GiveUp, wait_until_async
from stoa_translate.policies import SUPPORTED_KINDS

SEED = 20261201
MAX_EXAMPLES = 10
# About one CPU-minute for schemathesis itself (plus the CP and PostgreSQL); the bound leaves room
# for a machine shared with other work.
BUDGET_S = 420
CONFIG = Path(__file__).with_name("schemathesis.toml")
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
TOKEN = "fuzz-admin-token"
# Whatever the CP fetches (an issuer's jwks_uri) goes to a loopback port nobody serves: no traffic
# leaves the machine, and a key set is never there (the documented 502).
NOWHERE = "http://127.0.0.1:9"


@pytest.mark.timeout(BUDGET_S + 60)
async def test_a_schema_driven_fuzz_run_finds_nothing(pg, tmp_path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "STOA_CP_DATABASE_URL": pg.create_database(f"fuzz_{uuid.uuid4().hex[:12]}"),
        "STOA_CP_ADMIN_TOKENS": TOKEN,
        "STOA_CP_PORT": str(port),
        "STOA_CP_LOG_LEVEL": "warning",
        # No Envoy to validate a preview with: `?validate=envoy` is the documented 503.
        "STOA_CP_ENVOY_BINARY": "/nonexistent/envoy",
        **{name: NOWHERE for name in ("ALL_PROXY", "HTTP_PROXY", "HTTPS_PROXY")},
    }
    log = (tmp_path / "cp.log").open("wb")
    cp = await asyncio.create_subprocess_exec(console_script("stoa-cp"), env=env, stdout=log, stderr=log)
    try:

        async def ready() -> bool:
            if cp.returncode is not None:
                raise GiveUp(f"the CP stopped during start-up ({cp.returncode})")
            try:
                async with AsyncCPClient(url, None) as client:
                    return (await client.answer("GET", "/health/ready")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until_async(ready, 30, "the CP to be ready")
        report = tmp_path / "schemathesis.txt"
        with report.open("wb") as out:
            fuzz = await asyncio.create_subprocess_exec(
                console_script("schemathesis"),
                "--config-file",
                str(CONFIG),
                "run",
                f"{url}/openapi.json",
                "--checks",
                "all",
                "--seed",
                str(SEED),
                "--max-examples",
                str(MAX_EXAMPLES),
                "--workers",
                "2",  # one generates while the other waits on the CP
                "--header",
                f"Authorization: Bearer {TOKEN}",
                "--no-color",
                cwd=tmp_path,
                env={**os.environ, "SCHEMATHESIS_HOOKS": HOOKS.stem, "PYTHONPATH": str(HOOKS.parent)},
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                await asyncio.wait_for(fuzz.wait(), timeout=BUDGET_S)
            except TimeoutError:
                fuzz.kill()
                await fuzz.wait()
                pytest.fail(f"the fuzz run took more than {BUDGET_S} s; its report so far: {report}")
        text = report.read_text(errors="replace")
        print(text[-3000:])  # the phases and their durations, shown with -s or on failure
        assert fuzz.returncode == 0, f"the whole report: {report}\n{text[-20000:]}"
    finally:
        if cp.returncode is None:
            cp.terminate()
            await cp.wait()
        log.close()


def test_every_policy_kind_the_site_supports_has_its_published_body() -> None:
    """A kind added to the translator is refused by the CP's `oneOf` until its config is published."""
    published = tuple(typing.get_args(kind.model_fields["type"].annotation)[0] for kind in schemas.KINDS)
    assert published == SUPPORTED_KINDS


def _core_patterns(node: object, where: str = "") -> list[str]:
    """Places in a core schema where pydantic itself would enforce a pattern (and answer a 422 that
    quotes the regular expression)."""
    if isinstance(node, dict):
        found = [where] if node.get("type") == "str" and "pattern" in node else []
        for key, value in node.items():
            found += _core_patterns(value, f"{where}.{key}")
        return found
    if isinstance(node, list | tuple):
        return [hit for i, item in enumerate(node) for hit in _core_patterns(item, f"{where}[{i}]")]
    return []


def test_every_published_pattern_is_refused_in_words() -> None:
    """Patterns are published through `stoa_cp.syntax.Syntax`, whose refusal says the rule in words
    (the console shows it next to the field); none is left to pydantic's own pattern check."""
    models = [
        value
        for value in vars(schemas).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == schemas.__name__
    ]
    assert models
    leftovers = {m.__name__: _core_patterns(m.__pydantic_core_schema__) for m in models}
    assert {name: places for name, places in leftovers.items() if places} == {}


@pytest.mark.parametrize(
    ("model", "body", "field", "says"),
    [
        (schemas.TenantIn, {"tenant_id": "bad id!", "name": "x"}, "tenant_id", "must be 1 to 64 letters"),
        (schemas.TenantIn, {"tenant_id": "t", "name": "a\x01"}, "name", "must not contain control"),
        (schemas.IpFilterConfig, {"mode": "deny", "ip_list": ["10.0.0.1/8"]}, "ip_list", "host bits"),
        (schemas.CorsConfig, {"allowedOrigins": ["ftp://x"]}, "allowedOrigins", "must be '*', an origin"),
        (
            schemas.ConsumerIn,
            {"consumer_id": "c", "name": "C", "client_ids": ["a b"]},
            "client_ids",
            "visible",
        ),
    ],
)
def test_a_refusal_names_the_field_and_says_the_rule(model, body, field, says) -> None:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    [error] = refused.value.errors()
    assert error["loc"][0] == field
    assert says in error["msg"]
    assert "pattern" not in error["msg"]
