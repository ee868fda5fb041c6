"""The site services' shared settings: what start-up refuses, what it warns of, per environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_settings import SettingsConfigDict
from stoa_ops.site_settings import ConfigError, SiteSettings


class Example(SiteSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_EXAMPLE_", extra="ignore")

    grpc_address: str = "127.0.0.1:9391"
    http_address: str = "127.0.0.1:9392"


def test_development_without_tls_warns_and_production_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOA_ENV", "development")
    refused, warnings = Example().site_checks()
    assert refused == []
    assert warnings == ["no ADS client certificate configured: connecting to the ADS server without TLS"]
    monkeypatch.setenv("STOA_ENV", "production")
    refused, warnings = Example().site_checks()
    assert refused == ["STOA_EXAMPLE_TLS_CA, STOA_EXAMPLE_TLS_CERT and STOA_EXAMPLE_TLS_KEY must all be set"]
    files = {name: tmp_path / name for name in ("tls_ca", "tls_cert", "tls_key")}
    assert Example(**files).site_checks() == ([], [])


def test_tls_files_in_part_and_an_address_that_is_not_host_port_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="go together"):
        Example(tls_ca=tmp_path / "ca").site_checks()
    with pytest.raises(ConfigError, match="STOA_EXAMPLE_ADS_ADDRESS"):
        Example(ads_address="no-port").site_checks()


def test_a_service_address_off_loopback_is_warned_of(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOA_EXAMPLE_HTTP_ADDRESS", "0.0.0.0:9392")
    _, warnings = Example().site_checks()
    assert "http_address 0.0.0.0:9392 is not loopback and has no TLS of its own" in warnings
    assert Example().address("http_address") == ("0.0.0.0", 9392)
