"""Shared fixtures of the acceptance suite: one embedded PostgreSQL for the whole session, estates
(CP + Link + real Envoy + echo upstream + Check witness or stoa-authz) per test module, and the
in-process ADS site (the Link's ADS server with a real Envoy) for the ADS tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
from stoa_harness.ads_site import AdsSite, make_cluster, make_listener, make_routes, make_snapshot
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_proto import inventory_pb2

StartEstate = Callable[..., Estate]


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as pg:
        yield pg


@pytest.fixture(scope="module")
def idp(request: pytest.FixtureRequest) -> Iterator[DevIdentityProvider]:
    """The module's identity provider, started: tokens for the module's `AUDIENCE`, signed with its
    `IDP_ALG` (RS256 when it names none)."""
    alg = getattr(request.module, "IDP_ALG", "RS256")
    with DevIdentityProvider(alg=alg, audience=request.module.AUDIENCE) as provider:
        yield provider


@pytest.fixture(scope="module")
def estates(postgres: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartEstate]:
    """Start an estate for the module: `estates(options, name)`, each on its own CP database and run
    directory, all stopped (by PID) when the module is done, also when a later start fails."""
    with contextlib.ExitStack() as stack:

        def start(options: EstateOptions | None = None, name: str = "estate") -> Estate:
            estate = Estate(options, postgres=postgres, run_dir=tmp_path_factory.mktemp(name))
            return stack.enter_context(estate)

        yield start


@pytest.fixture(scope="module")
def estate(estates: StartEstate) -> Estate:
    """A module's own estate (its own CP database, gateway `gw-1`, the witness allowing everything)."""
    return estates()


@pytest.fixture
def witness_allows(estate: Estate) -> Iterator[None]:
    """Each test starts with no recorded Checks and the witness allowing; a hang is released after."""
    estate.witness.clear()
    yield
    estate.witness.clear()


@pytest.fixture
def fresh_records(witness_allows: None, estate: Estate) -> None:
    """As `witness_allows`, and the echo upstream with no recorded arrivals, answering by default."""
    estate.upstream.clear()


@pytest.fixture(scope="module")
def upstream() -> Iterator[EchoUpstream]:
    """An echo upstream of the module's own (the ADS site's backends point at it)."""
    with EchoUpstream() as echo:
        yield echo


@pytest.fixture(scope="module", params=["sotw", "delta"])
def ads_site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, upstream: EchoUpstream
) -> Iterator[AdsSite]:
    """The Link's ADS server with a real Envoy (`AdsSite`), brought up on generation 1: one route `/a`
    to the module's echo upstream, SYNCED and serving; once with Envoy on state-of-the-world xDS and
    once on incremental (delta) xDS."""
    site = AdsSite(tmp_path_factory.mktemp(f"ads-site-{request.param}"), xds=request.param)
    try:
        report = site.apply(
            1,
            make_snapshot(
                1,
                [make_cluster("backend_a", upstream.port)],
                make_listener(site.listener_port),
                make_routes([("/a", "backend_a")]),
            ),
        )
        assert report is not None
        assert report.status == inventory_pb2.SYNCED, report
        wait_until(
            lambda: site.get("/a/ready").status_code == 200, 10, "the first route serving through Envoy"
        )
        yield site
    finally:
        site.close()
