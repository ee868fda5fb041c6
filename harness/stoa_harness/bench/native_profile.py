"""What each part of the native route's configuration costs Envoy (the evidence of bench/PROFILE-native.md).

The translator's own rendering of the bench's native JWT route (`stoa_translate.translate` of the
data-path API, with the Link's options) is served by one Envoy as listener `full`, beside `proxy` (the
bench's proxy-only listener: router only), `floor` (the same listener and route rendered without a
token, auth `none`) and `full` with one feature taken away (`no_<feature>`), done another way
(`alt_<feature>`) or as before the profile (`old_<feature>`); `a+b` combines them. All in front of
the bench's fast upstream, with the bench's cached token.

- `--callgrind`: Envoy (one worker thread) under valgrind's callgrind, one connection at a time;
  the instructions it executes per request on each listener, counted between `callgrind_control`
  zero and dump. Independent of what else the machine runs: the figure to compare features with.
  Needs valgrind (Debian `valgrind`).
- otherwise: Envoy with two worker threads (as the estate's) and wrk at 32 connections against each
  listener in turn, `proxy` at the start and the end of every round: each variant's rps over its
  round's proxy-only rps, and the gateway's CPU µs per request. Moved by whatever shares the machine.

    uv run --frozen python -m stoa_harness.bench.native_profile [--callgrind] [--rounds 3] \
        [--duration 5] [--out FILE] [VARIANT...]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from google.protobuf import json_format
from stoa_proto import inventory_pb2
from stoa_translate import TranslateOptions, translate
from stoa_translate.static import static_bootstrap

from stoa_harness.bench.load import WrkResult, run_wrk
from stoa_harness.bench.rig import AUDIENCE, SCOPE, TENANT, FastUpstream, cpu_seconds, http_listener
from stoa_harness.envoy import EnvoyProcess, envoy_binary
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.ports import free_port
from stoa_harness.processes import SupervisedProcess
from stoa_harness.wait import wait_until

API_ID = "bench-dp"
PATH = f"/apis/{API_ID}/resource"
CONNECTIONS = 32
DECISION_LOG_CLUSTER = "stoa-ads"  # the Link's ADS cluster (nothing listens: only denials are logged)
H2 = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
}

Doc = dict[str, Any]


def _manager(listener: Doc) -> Doc:
    manager: Doc = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager


def _api_entry(manager: Doc) -> Doc:
    (entry,) = [r for r in manager["route_config"]["virtual_hosts"][0]["routes"] if "route" in r]
    return entry


def _provider(manager: Doc) -> Doc:
    (jwt,) = [f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.jwt_authn"]
    (provider,) = jwt["typed_config"]["providers"].values()
    return dict(provider)


def _drop_filter(name: str) -> Callable[[Doc], None]:
    def apply(manager: Doc) -> None:
        manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] != name]
        _api_entry(manager)["typed_per_filter_config"].pop(name, None)

    return apply


def _pop(*keys: str) -> Callable[[Doc], None]:
    def apply(manager: Doc) -> None:
        for key in keys:
            manager.pop(key, None)

    return apply


def _set_provider(**fields: Any) -> Callable[[Doc], None]:
    def apply(manager: Doc) -> None:
        (jwt,) = [f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.jwt_authn"]
        for provider in jwt["typed_config"]["providers"].values():
            for key, value in fields.items():
                if value is None:
                    provider.pop(key, None)
                else:
                    provider[key] = value

    return apply


def _no_refusals(manager: Doc) -> None:
    host = manager["route_config"]["virtual_hosts"][0]
    host["routes"] = [r for r in host["routes"] if "route" in r]


def _prefix_rewrite(manager: Doc) -> None:
    action = _api_entry(manager)["route"]
    action.pop("regex_rewrite", None)
    action["prefix_rewrite"] = "/"  # /apis/x/resource → //resource: the cost of the rewrite only


def _no_entry_headers(manager: Doc) -> None:
    entry = _api_entry(manager)
    entry.pop("request_headers_to_add", None)
    entry.pop("request_headers_to_remove", None)


def _no_method_match(manager: Doc) -> None:
    _api_entry(manager)["match"].pop("headers", None)


def _claims_simple(manager: Doc) -> None:
    """The spike's claims rule: one ALLOW policy, tenant exact and the scope regex on the payload."""

    def claim(key: str, value: Doc) -> Doc:
        path = [{"key": "payload"}, {"key": key}]
        matcher = {"filter": "envoy.filters.http.jwt_authn", "path": path, "value": value}
        return {"sourced_metadata": {"metadata_matcher": matcher}}

    principal = {
        "and_ids": {
            "ids": [
                claim("tenant_id", {"string_match": {"exact": TENANT}}),
                claim("scope", {"string_match": {"safe_regex": {"regex": f"(.* )?{SCOPE}( .*)?"}}}),
            ]
        }
    }
    rules = {
        "action": "ALLOW",
        "policies": {"ok": {"permissions": [{"any": True}], "principals": [principal]}},
    }
    per_route = _api_entry(manager)["typed_per_filter_config"]["stoa.rbac.claims"]
    per_route["rbac"] = {"rules": rules}


def _old_access_log(manager: Doc) -> None:
    """The decision log's CEL expression evaluated for every response (before bench/PROFILE-native.md)."""
    for log in manager.get("access_log", []):
        gate = log["filter"].get("and_filter")
        if gate is not None:
            log["filter"] = gate["filters"][-1]


def _old_claims_order(manager: Doc) -> None:
    """The claims policies' conditions in their former order: the token's rules first in each."""
    per_route = _api_entry(manager)["typed_per_filter_config"]["stoa.rbac.claims"]
    for name, policy in per_route["rbac"]["rules"]["policies"].items():
        if name != "stoa:token":
            policy["principals"][0]["and_ids"]["ids"].reverse()


def _old_ext_authz(manager: Doc) -> None:
    """ext_authz in the route's chain, disabled by its own per-route config."""
    per_route = _api_entry(manager)["typed_per_filter_config"]
    per_route["envoy.filters.http.ext_authz"] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute",
        "disabled": True,
    }


# Each takes the `full` listener's HTTP connection manager and changes it in place.
VARIANTS: dict[str, Callable[[Doc], None]] = {
    "no_access_log": _pop("access_log"),
    "no_early_header_mutation": _pop("early_header_mutation_extensions"),
    "no_normalize_path": _pop("normalize_path", "merge_slashes", "path_with_escaped_slashes_action"),
    "no_remote_address": _pop("use_remote_address", "internal_address_config"),
    "no_local_reply_config": _pop("local_reply_config"),
    "no_refusal_routes": _no_refusals,
    "alt_prefix_rewrite": _prefix_rewrite,
    "no_method_match": _no_method_match,
    "no_entry_headers": _no_entry_headers,
    "no_request_rbac": _drop_filter("stoa.rbac.request"),
    "no_claims_rbac": _drop_filter("stoa.rbac.claims"),
    "alt_claims_simple": _claims_simple,
    "no_ext_authz": _drop_filter("envoy.filters.http.ext_authz"),
    "no_claim_to_headers": _set_provider(claim_to_headers=None),
    "no_header_in_metadata": _set_provider(header_in_metadata=None),
    "alt_forward_false": _set_provider(forward=False),
    "no_jwt_cache": _set_provider(jwt_cache_config=None),
    "old_access_log": _old_access_log,
    "old_claims_order": _old_claims_order,
    "old_ext_authz": _old_ext_authz,
}


def inventory(upstream_url: str, issuer: str, jwks: Doc, auth_mode: str = "jwt") -> inventory_pb2.Inventory:
    """The bench's data-path API as the CP sends it to the Link."""
    route = {
        "route_id": API_ID,
        "tenant_id": TENANT,
        "api_id": API_ID,
        "path_prefix": f"/apis/{API_ID}",
        "methods": ["GET"],
        "upstream_url": upstream_url,
        "auth_mode": auth_mode,
        "scopes": [SCOPE] if auth_mode == "jwt" else [],
    }
    issuer_doc = {"tenant_id": TENANT, "issuer": issuer, "jwks_json": json.dumps(jwks)}
    doc = {"gateway_id": "bench", "generation": "1", "routes": [route], "issuers": [issuer_doc]}
    return json_format.ParseDict(doc, inventory_pb2.Inventory())


def bootstrap(
    upstream_url: str, issuer: str, jwks: Doc, names: list[str], admin_port: int
) -> tuple[Doc, dict[str, int]]:
    """One static bootstrap: a listener per variant in `names` (each on its own port, stat prefix = name)."""
    options = TranslateOptions(audience=AUDIENCE, decision_log_cluster=DECISION_LOG_CLUSTER)
    rendered = {
        mode: static_bootstrap({"x": (translate(inventory(upstream_url, issuer, jwks, mode), options), 1)})
        for mode in ("jwt", "none")
    }
    base = rendered["jwt"]
    clusters = {c["name"]: c for doc in rendered.values() for c in doc["static_resources"]["clusters"]}
    (backend,) = [name for name in clusters if name.startswith("backend_")]
    dead = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}}}
    clusters[DECISION_LOG_CLUSTER] = {
        "name": DECISION_LOG_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": DECISION_LOG_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": dead}]}],
        },
        "typed_extension_protocol_options": H2,
    }
    ports: dict[str, int] = {}
    listeners = []
    for name in names:
        port = ports[name] = free_port()
        if name == "proxy":
            listener = http_listener("proxy", port, {"route": {"cluster": backend}})
        else:
            source = rendered["none"] if name == "floor" else base
            listener = copy.deepcopy(source["static_resources"]["listeners"][0])
            listener["address"]["socket_address"]["port_value"] = port
            if name not in ("full", "floor"):
                for part in name.split("+"):  # several changes at once: `a+b`
                    VARIANTS[part](_manager(listener))
        listener["name"] = name
        _manager(listener)["stat_prefix"] = name
        listeners.append(listener)
    doc = {
        "node": {"id": "native-profile", "cluster": "bench"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"clusters": list(clusters.values()), "listeners": listeners},
    }
    return doc, ports


class _Setup:
    """The IdP (for its keys and the token), the fast upstream, and the bootstrap of `names`."""

    def __init__(self, names: list[str], run_dir: Path) -> None:
        self.names = ["proxy", *[n for n in names if n != "proxy"]]
        self.run_dir = run_dir
        self.admin_port = free_port()
        self._idp = DevIdentityProvider(alg="RS256", audience=AUDIENCE)
        self._upstream = FastUpstream(run_dir, ("a",))
        self.token = ""
        self.ports: dict[str, int] = {}
        self.path = run_dir / "native-profile.json"
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Setup:
        with contextlib.ExitStack() as stack:
            idp = stack.enter_context(self._idp)
            upstream = stack.enter_context(self._upstream)
            self.token = idp.mint(tenant=TENANT, scope=SCOPE, sub="bench-0", lifetime_s=3600)
            doc, self.ports = bootstrap(
                upstream.url("a"), idp.issuer, idp.jwks(), self.names, self.admin_port
            )
            self.path.write_text(json.dumps(doc))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stack.close()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def load(self, name: str, connections: int, duration_s: float) -> WrkResult:
        result = run_wrk(
            self.url(name), paths=[PATH], tokens=[self.token], connections=connections, duration_s=duration_s
        )
        if result.non_2xx or result.socket_errors:
            raise AssertionError(f"{name}: {result.non_2xx} non-2xx, {result.socket_errors} socket errors")
        return result

    def counter(self, stat: str) -> int:
        text = httpx.get(
            f"http://127.0.0.1:{self.admin_port}/stats", params={"filter": f"^{re.escape(stat)}$"}, timeout=60
        ).text
        return int(text.split(": ", 1)[1])

    def jwt_stats(self) -> dict[str, int]:
        """jwt_authn's verdicts and cache use per listener: every request allowed, the cache hit."""
        wanted = r"jwt_authn\.(allowed|denied|jwt_cache_hit|jwt_cache_miss)$"
        text = httpx.get(
            f"http://127.0.0.1:{self.admin_port}/stats", params={"filter": wanted}, timeout=60
        ).text
        return {n: int(v) for n, v in (line.split(": ", 1) for line in text.splitlines() if ": " in line)}


def _per_round(samples: dict[str, list[float]], name: str, reference: str) -> float:
    """Median over rounds of `reference` minus `name` in the same round (drift between rounds cancels)."""
    return statistics.median(r - n for r, n in zip(samples[reference], samples[name], strict=True))


def timed(names: list[str], rounds: int, duration_s: float, run_dir: Path) -> Doc:
    """rps ratio and gateway CPU per request of each variant under wrk (two worker threads)."""
    with _Setup(names, run_dir) as setup:
        envoy = EnvoyProcess(setup.path, setup.admin_port, run_dir / "native-profile-envoy.log")
        with envoy:
            pid = envoy.pid
            assert pid is not None
            for name in setup.names:
                wait_until(lambda n=name: setup.load(n, 1, 1).requests > 0, 30, f"{name} answers 200")
            ratio: dict[str, list[float]] = {n: [] for n in setup.names}
            cpu: dict[str, list[float]] = {n: [] for n in setup.names}
            rps: dict[str, list[float]] = {n: [] for n in setup.names}
            loads = []
            others = setup.names[1:]
            for i in range(rounds):
                shift = i % max(1, len(others))
                order = ["proxy", *others[shift:], *others[:shift], "proxy"]
                got: dict[str, list[tuple[float, float]]] = {n: [] for n in setup.names}
                for name in order:
                    before = cpu_seconds([pid])
                    result = setup.load(name, CONNECTIONS, duration_s)
                    used = cpu_seconds([pid]).seconds - before.seconds
                    got[name].append((result.rps, used / result.requests * 1e6))
                    loads.append(os.getloadavg()[0])
                baseline = statistics.mean(r for r, _ in got["proxy"])
                for name, phases in got.items():
                    rps[name].append(statistics.mean(r for r, _ in phases))
                    cpu[name].append(statistics.mean(c for _, c in phases))
                    ratio[name].append(rps[name][-1] / baseline)
                print(f"round {i + 1}/{rounds}, load {loads[-1]:.1f}", file=sys.stderr)
            stats = setup.jwt_stats()
    variants = {
        name: {
            "rps": statistics.median(rps[name]),
            "ratio": statistics.median(ratio[name]),
            "ratio_spread": [min(ratio[name]), max(ratio[name])],
            "cpu_us_per_request": statistics.median(cpu[name]),
            "cpu_us_over_proxy": 0.0 - _per_round(cpu, name, "proxy"),
        }
        for name in setup.names
    }
    return {
        "mode": "wrk",
        "rounds": rounds,
        "duration_s": duration_s,
        "connections": CONNECTIONS,
        "load1_median": statistics.median(loads),
        "variants": variants,
        "jwt_authn_stats": stats,
        "raw": {"ratio": ratio, "cpu_us_per_request": cpu, "rps": rps},
    }


def _callgrind_envoy(setup: _Setup) -> SupervisedProcess:
    if shutil.which("valgrind") is None:
        raise RuntimeError("--callgrind needs valgrind (apt-get install -y valgrind)")
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={setup.run_dir}/callgrind.%p",
        envoy_binary(),
        *("-c", str(setup.path), "--concurrency", "1", "--use-dynamic-base-id", "-l", "warning"),
    ]
    admin = f"http://127.0.0.1:{setup.admin_port}/ready"
    return SupervisedProcess(
        "native-profile-callgrind",
        argv,
        log_dir=setup.run_dir,
        ready=lambda: httpx.get(admin, timeout=1.0).status_code == 200,
        ready_timeout=300,
        stop_timeout=60,
    )


def _callgrind(command: str, pid: int) -> None:
    subprocess.run(["callgrind_control", command, str(pid)], check=True, capture_output=True, timeout=120)


def _instructions(run_dir: Path, pid: int) -> int:
    """Instructions counted in the newest dump of `pid`."""
    dumps = sorted(run_dir.glob(f"callgrind.{pid}.*"), key=lambda p: int(p.suffix[1:]))
    for line in dumps[-1].read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"{dumps[-1]}: no summary line")


def counted(names: list[str], rounds: int, window_s: float, run_dir: Path) -> Doc:
    """Instructions Envoy executes per request on each variant's listener (callgrind, one worker)."""
    with _Setup(names, run_dir) as setup, _callgrind_envoy(setup) as envoy:
        pid = envoy.pid
        assert pid is not None
        for name in setup.names:
            setup.load(name, 1, 1)  # warm-up: connections open, the token cached
        samples: dict[str, list[float]] = {name: [] for name in setup.names}
        # Interleaved, one connection: one read and one write per request on each side, no batching
        # that depends on timing. Each round counts every variant; deltas are taken within a round.
        for i in range(rounds):
            for name in setup.names:
                stat = f"http.{name}.downstream_rq_completed"
                before = setup.counter(stat)
                _callgrind("-z", pid)
                setup.load(name, 1, window_s)
                _callgrind("-d", pid)
                samples[name].append(_instructions(run_dir, pid) / (setup.counter(stat) - before))
            line = ", ".join(f"{n} {s[-1]:,.0f}" for n, s in samples.items())
            print(f"round {i + 1}/{rounds}: {line}", file=sys.stderr)
        _callgrind("-z", pid)
        time.sleep(window_s)
        _callgrind("-d", pid)
        idle = _instructions(run_dir, pid) / window_s
        stats = setup.jwt_stats()
    full = "full" in samples
    return {
        "mode": "callgrind",
        "rounds": rounds,
        "window_s": window_s,
        "idle_instructions_per_s": idle,
        "variants": {
            name: {
                "instructions_per_request": statistics.median(runs),
                "spread": [min(runs), max(runs)],
                "over_proxy": 0.0 - _per_round(samples, name, "proxy"),
                "saved_from_full": _per_round(samples, name, "full") if full else None,
            }
            for name, runs in samples.items()
        },
        "jwt_authn_stats": stats,
        "raw": samples,
    }


def _print(result: Doc) -> None:
    if result["mode"] == "callgrind":
        print(f"Envoy's idle background: {result['idle_instructions_per_s']:,.0f} instructions/s")
        print(f"{'variant':40s} {'instr/req':>10s} {'vs proxy':>9s} {'vs full':>8s}  (min-max)")
        for name, c in result["variants"].items():
            saved = "" if c["saved_from_full"] is None else f"{0.0 - c['saved_from_full']:+8,.0f}"
            low, high = c["spread"]
            figures = f"{c['instructions_per_request']:10,.0f} {c['over_proxy']:9,.0f} {saved:>8s}"
            print(f"{name:40s} {figures}  ({low:,.0f}-{high:,.0f})")
    else:
        print(f"load average (1 min, median over phases): {result['load1_median']:.1f}")
        print(f"{'variant':40s} {'rps':>7s} {'ratio':>6s} {'(min-max)':>11s} {'µs/req':>7s} {'vs proxy':>8s}")
        for name, s in result["variants"].items():
            low, high = s["ratio_spread"]
            figures = f"{s['rps']:7.0f} {s['ratio']:6.2f} {low:5.2f}-{high:<5.2f}"
            print(f"{name:40s} {figures} {s['cpu_us_per_request']:7.1f} {s['cpu_us_over_proxy']:8.1f}")
    print(json.dumps(result["jwt_authn_stats"], indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("variants", nargs="*", help="variants to measure (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5, help="seconds of load per variant and round")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--callgrind", action="store_true", help="count Envoy's instructions per request")
    args = parser.parse_args()
    names = args.variants or ["full", "floor", *VARIANTS]
    unknown = {p for n in names for p in n.split("+")} - {"proxy", "full", "floor", *VARIANTS}
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="stoa-native-profile-") as tmp:
        measure = counted if args.callgrind else timed
        result = measure(names, args.rounds, args.duration, Path(tmp))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
