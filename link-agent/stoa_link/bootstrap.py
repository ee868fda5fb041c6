"""The Envoy bootstrap: node, ADS over mutual TLS to the Link's loopback address, admin on loopback.

The template is `envoy/bootstrap.yaml` at the repository root (installed into the wheel as
`stoa_link/envoy/bootstrap.yaml`); values are substituted as JSON scalars, which YAML reads verbatim.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from string import Template

from stoa_link import certs
from stoa_link.settings import LinkSettings

_CANDIDATES = (
    Path(__file__).parent / "envoy" / "bootstrap.yaml",  # installed wheel
    Path(__file__).resolve().parents[2] / "envoy" / "bootstrap.yaml",  # source tree
)


# The name of the ADS cluster in envoy/bootstrap.yaml: Envoy also sends its native denials' access
# log on it (to the Link's same authenticated server).
ADS_CLUSTER = "stoa-ads"


def template_path() -> Path:
    for path in _CANDIDATES:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"Envoy bootstrap template not found (looked in {', '.join(map(str, _CANDIDATES))})"
    )


def render(settings: LinkSettings, node_id: str | None = None) -> str:
    tls_dir = settings.tls_dir.resolve()
    files = {
        "client_cert": tls_dir / certs.ENVOY_CERT_FILE,
        "client_key": tls_dir / certs.ENVOY_KEY_FILE,
        "ca": tls_dir / certs.CA_FILE,
    }
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"Envoy TLS files missing: {', '.join(missing)} "
            f"(create them with `stoa-link certs --out {tls_dir}`)"
        )
    host, port = settings.ads_endpoint
    values: dict[str, str | int] = {
        "node_id": node_id or f"stoa-envoy-{settings.gateway_id or 'site'}",
        "node_cluster": "stoa-gateway",
        "admin_port": settings.envoy_admin_port,
        "ads_host": host,
        "ads_port": port,
        "ads_api_type": "DELTA_GRPC" if settings.xds == "delta" else "GRPC",
        **{key: str(path) for key, path in files.items()},
    }
    return Template(template_path().read_text()).substitute({k: json.dumps(v) for k, v in values.items()})


def write(settings: LinkSettings, out: Path, node_id: str | None = None) -> None:
    text = render(settings, node_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
