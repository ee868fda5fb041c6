"""Development certificates, the Envoy bootstrap, and the start-up refusals of `stoa-link`."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID, NameOID
from stoa_link import bootstrap, certs, cli
from stoa_link.settings import LinkSettings, loopback_endpoint

ENVOY = "spiffe://stoa.local/envoy"
AUTHZ = "spiffe://stoa.local/ext-authz"


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    assert certs.write_dev_certs(out, ENVOY, AUTHZ)
    return out


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_files_and_key_types(tls_dir: Path) -> None:
    assert sorted(p.name for p in tls_dir.iterdir()) == sorted(certs.ALL_FILES)
    for name in certs.ALL_FILES:
        if name.endswith("key.pem"):
            assert (tls_dir / name).stat().st_mode & 0o077 == 0, f"{name} is readable by others"
    ca = load(tls_dir / certs.CA_FILE)
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "STOA development CA"
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.public_key().curve.name == "secp256r1"


def test_server_certificate_names_localhost(tls_dir: Path) -> None:
    san = load(tls_dir / certs.SERVER_CERT_FILE).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert san.value.get_values_for_type(x509.DNSName) == ["localhost"]
    assert "127.0.0.1" in [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)]


@pytest.mark.parametrize(("name", "uri"), [(certs.ENVOY_CERT_FILE, ENVOY), (certs.AUTHZ_CERT_FILE, AUTHZ)])
def test_client_identity_is_only_a_critical_uri_san(tls_dir: Path, name: str, uri: str) -> None:
    cert = load(tls_dir / name)
    assert len(cert.subject) == 0
    ext = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    assert ext.critical
    assert list(ext.value) == [x509.UniformResourceIdentifier(uri)]
    assert certs.issued_by_dev_ca((tls_dir / name).read_bytes())


def test_existing_set_is_kept_and_partial_set_refused(tmp_path: Path) -> None:
    assert certs.write_dev_certs(tmp_path, ENVOY, AUTHZ)
    before = (tmp_path / certs.CA_FILE).read_bytes()
    assert not certs.write_dev_certs(tmp_path, ENVOY, AUTHZ)
    assert (tmp_path / certs.CA_FILE).read_bytes() == before
    (tmp_path / certs.SERVER_KEY_FILE).unlink()
    with pytest.raises(FileExistsError, match="--force"):
        certs.write_dev_certs(tmp_path, ENVOY, AUTHZ)
    assert certs.write_dev_certs(tmp_path, ENVOY, AUTHZ, force=True)
    assert (tmp_path / certs.CA_FILE).read_bytes() != before


def test_production_refuses_the_development_ca(
    tls_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in {
        "ENV": "production",
        "CP_URL": "http://127.0.0.1:9",
        "GATEWAY_ID": "gw",
        "GATEWAY_CREDENTIAL": "x",
        "TLS_DIR": str(tls_dir),
        "STATE_DIR": str(tmp_path),
        "ADS_ADDRESS": "127.0.0.1:0",
    }.items():
        monkeypatch.setenv(f"STOA_LINK_{key}", value)
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert "production" in err
    assert "STOA development CA" in err


def test_run_without_cp_settings_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("CP_URL", "GATEWAY_ID", "GATEWAY_CREDENTIAL"):
        monkeypatch.delenv(f"STOA_LINK_{key}", raising=False)
    assert cli.main(["run"]) == 2
    assert "STOA_LINK_CP_URL, STOA_LINK_GATEWAY_ID, STOA_LINK_GATEWAY_CREDENTIAL" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:18000", ("127.0.0.1", 18000)), ("127.3.4.5:1", ("127.3.4.5", 1)), ("[::1]:9", ("::1", 9))],
)
def test_loopback_addresses_are_accepted(address: str, expected: tuple[str, int]) -> None:
    assert loopback_endpoint(address) == expected


@pytest.mark.parametrize(
    "address", ["0.0.0.0:1", "10.1.2.3:1", "[::]:1", "example.com:1", "127.0.0.1", ":80"]
)
def test_other_addresses_are_refused(address: str) -> None:
    with pytest.raises(ValueError, match="ADS address"):
        loopback_endpoint(address)


def test_bootstrap_points_envoy_at_the_ads_address_over_mtls(tls_dir: Path, tmp_path: Path) -> None:
    settings = LinkSettings(
        ads_address="127.0.0.1:18123", tls_dir=tls_dir, envoy_admin_port=9911, gateway_id="gw"
    )
    out = tmp_path / "envoy.yaml"
    bootstrap.write(settings, out)
    text = out.read_text()
    assert "port_value: 18123" in text
    assert 'address: "127.0.0.1", port_value: 9911' in text
    assert str((tls_dir / certs.ENVOY_CERT_FILE).resolve()) in text
    assert "tls_minimum_protocol_version: TLSv1_3" in text
    assert "set_node_on_first_message_only: true" in text
    assert "$" not in text


def test_bootstrap_without_certificates_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="stoa-link certs"):
        bootstrap.render(LinkSettings(tls_dir=tmp_path))
