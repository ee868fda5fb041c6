"""Shared fixtures of the acceptance suite: one embedded PostgreSQL for the whole session, and
estates (CP + Link + real Envoy + echo upstream + Check witness or stoa-authz) per test module."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.postgres import EmbeddedPostgres

StartEstate = Callable[..., Estate]


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as pg:
        yield pg


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
