"""Shared fixtures of the acceptance suite: one embedded PostgreSQL for the whole session, and an
estate (CP + Link + real Envoy + echo upstream + Check witness) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.postgres import EmbeddedPostgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as pg:
        yield pg


@pytest.fixture(scope="module")
def estate(postgres: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Estate]:
    """A module's own estate (its own CP database, gateway `gw-1`, the witness allowing everything)."""
    with Estate(EstateOptions(), postgres=postgres, run_dir=tmp_path_factory.mktemp("estate")) as running:
        yield running


@pytest.fixture
def witness_allows(estate: Estate) -> Iterator[None]:
    """Each test starts with no recorded Checks and the witness allowing; a hang is released after."""
    estate.witness.clear()
    yield
    estate.witness.clear()
