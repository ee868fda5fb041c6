"""The report: report.json (every measured figure, the environment, every target with met / by how
much), summary.md (the table `make bench` prints) and PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a build machine
import matplotlib.pyplot as plt


def spread(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of the repetitions (and how many there were)."""
    if not values:
        raise ValueError("no values to summarise")
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 20 samples is the largest: no interpolation between samples)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def _machine() -> str:
    """The CPU model and host name: absolute figures differ two- to threefold between machines."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model} ({os.uname().nodename})"


def environment(repo: Path) -> dict[str, Any]:
    from stoa_harness.envoy import envoy_version

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=False
    )
    return {
        "machine": _machine(),
        "cores": os.cpu_count(),
        "envoy_version": envoy_version(),
        "git_commit": commit.stdout.strip() or "unknown",
        "git_dirty": bool(dirty.stdout.strip()),
        "kernel": os.uname().release,
    }


# (report key, label, unit, bound, "max" = measured must be ≤ bound, "min" = ≥ bound)
TARGETS: tuple[tuple[str, str, str, float, str], ...] = (
    ("data_path.native_ratio", "Envoy-decided JWT route / proxy-only (cached token)", "x", 0.75, "min"),
    ("data_path.native_uncached_ratio", "Envoy-decided JWT route / proxy-only (uncached)", "x", 0.5, "min"),
    ("data_path.authz_ratio", "authz-service route / proxy-only", "x", 0.3, "min"),
    ("data_path.authz_floor_ratio", "authz service / no-op Check server", "x", 0.8, "min"),
    ("data_path.added_p50_ms_one_conn", "added p50 at one connection", "ms", 0.5, "max"),
    ("data_path.authz_cpu_us_per_decision", "authz CPU per decision", "µs", 250.0, "max"),
    ("processing.proc_ratio", "guardrail route (1 KiB JSON) / proxy-only", "x", 0.3, "min"),
    ("processing.proc_floor_ratio", "guardrail route: stoa-proc / no-op processor", "x", 0.8, "min"),
    (
        "processing.proc_stream_ttfb_ratio",
        "streamed completion: added time to first byte, stoa-proc / no-op processor",
        "x",
        1.5,
        "max",
    ),
    ("publication.new_route_p99_ms.3000", "new route serving p99 at 3,000 routes", "ms", 150.0, "max"),
    ("publication.full_10000_s", "full publication of 10,000 routes", "s", 1.0, "max"),
    ("publication.one_change_10000_ms", "1-route change at 10,000 routes (SYNCED)", "ms", 200.0, "max"),
    ("publication.one_change_ratio", "1-route change at 10,000 ÷ at 100 (to serving)", "x", 1.5, "max"),
    ("publication.new_route_ratio", "new route p99 at 10,000 ÷ at 100", "x", 1.5, "max"),
    (
        "publication.full_10000_floor_ratio",
        "full 10,000-route publication ÷ Envoy accepting one table pushed alone",
        "x",
        1.5,
        "max",
    ),
    ("churn.non_2xx", "churn non-2xx responses", "", 0.0, "max"),
    (
        "consumers.billed_added_p50_ms_one_conn",
        "billed quota route: added p50 at one connection (vs plain JWT)",
        "ms",
        1.0,
        "max",
    ),
    ("consumers.opa_cpu_us_per_decision", "OPA decision CPU", "µs", 100.0, "max"),
    (
        "consumers.revocation_propagation_ms_max",
        "key revocation → refused through Envoy (max)",
        "ms",
        2000.0,
        "max",
    ),
)


# What the profiles show about each target, given with the figure whenever it is missed. The numbers
# quoted are from the profile write-ups named (measured on this kind of 2-core machine).
EXPLANATIONS: dict[str, str] = {
    "data_path.authz_ratio": (
        "Both cores are busy during the authz runs (see cpu_split): a request through ext_authz costs "
        "about 440 µs of CPU across processes against about 61 µs proxy-only, and Envoy's own side of "
        "the gRPC call is about 100 µs, so even a free authorization service would cap the ratio near "
        "0.33 on 2 cores. Of stoa-authz's ~225 µs per Check, ~40 µs is the decision (26 µs the "
        "per-request Ed25519 envelope); the rest is grpcio's server (perf: 37 % kernel thread "
        "hand-offs, 33 % interpreter, 11 % gRPC core). Extra workers cannot help with no idle core. "
        "Evidence: bench/PROFILE-authz.md."
    ),
    "data_path.native_ratio": (
        "Envoy alone decides (jwt_authn with its cache hit, rbac on the payload), on the same 2 cores "
        "as the upstream and wrk (see cpu_split): the ratio is the gateway Envoy's extra CPU per request. "
        "Counted with callgrind, the native route costs Envoy ~80,000 instructions per request over "
        "proxy-only (~40 µs here): ~29,000 the Link's listener and route that every route pays "
        "(identity-header stripping, path normalisation, refusal regexes, rewrite) and ~51,000 the "
        "decision (jwt_authn's payload and header metadata, the request-form and claims rbac filters), "
        "each kept for a rule of the one error contract. The decision log's CEL filter on every "
        "response, ext_authz created to be skipped and the claims rules' order cost ~48,000 more "
        "before; they are gone. Evidence: bench/PROFILE-native.md."
    ),
    "data_path.native_uncached_ratio": (
        "Every request verifies a signature in Envoy (RS256 here: ~430,000 instructions, five times "
        "the rest of the native route), on the same 2 cores as the upstream and wrk (see cpu_split). "
        "Evidence: bench/PROFILE-native.md."
    ),
    "data_path.authz_floor_ratio": (
        "The no-op server answers a prepared OK on the same grpcio server, so the gap is the service's "
        "own work per Check (decision, envelope, decision log): compare the authz CPU µs/decision of "
        "authz_cached_w1 and noop_check in the table below (same run; the no-op's is what grpcio costs). "
        "Both cores are busy in both phases, so each µs of the service's is taken from Envoy and the "
        "upstream. Evidence: bench/PROFILE-authz.md."
    ),
    "data_path.added_p50_ms_one_conn": (
        "At one connection the hop's latency is grpcio's synchronous server handing each call from its "
        "poller thread to a pool thread and back (three completion-queue events, two hand-offs per "
        "unary call), not the ~40 µs decision; a single pool thread was no faster. "
        "Evidence: bench/PROFILE-authz.md."
    ),
    "data_path.authz_cpu_us_per_decision": (
        "grpcio's server costs ~185 µs per Check before any STOA code runs. Evidence: bench/PROFILE-authz.md."
    ),
    "processing.proc_ratio": (
        "The processing hop is a gRPC stream per request with two messages (headers, buffered body) "
        "answered by a Python service on the same 2 cores as Envoy, the upstream and wrk (a Python "
        "hop caps near 0.33); see processing.variants and the no-op processor's own ratio."
    ),
    "processing.proc_floor_ratio": (
        "stoa-proc's own work per exchange (decode, normalise, RE2 patterns, PII candidates, the "
        "decision log) against a processor that answers prepared messages on the same grpcio server."
    ),
    "processing.proc_stream_ttfb_ratio": (
        "The added time to first byte of a no-op hop is a fraction of a millisecond; stoa-proc adds "
        "the request inspection and the first event's inspection to it (see the two added times)."
    ),
    "publication.new_route_p99_ms.3000": (
        "Each change re-sends the whole route table (state of the world) and Envoy rebuilds it "
        "(40-90 ms at 3,000 routes). Evidence: bench/PROFILE-publication.md."
    ),
    "publication.full_10000_s": (
        "A cold 10,000-route publication parses, translates and compiles every route once, and Envoy "
        "builds the 10,000-route table. Evidence: bench/PROFILE-publication.md."
    ),
    "publication.one_change_10000_ms": (
        "Envoy alone takes 130-140 ms to accept the single 10,000-route RouteConfiguration that "
        "state-of-the-world RDS re-sends for any change; with the CP's document build (~34 ms), the "
        "Link's parse (~34 ms) and translation (~68 ms) the chain is ~300 ms. Under 200 ms needs "
        "sending less than the whole table (VHDS or several route configurations) and no per-route "
        "regex rewrites (~70 ms of Envoy's time at 10,000). Evidence: bench/PROFILE-publication.md."
    ),
    "publication.one_change_ratio": (
        "The CP sends only what changed (publication.sse_bytes_one_change_10000) and the Link applies it "
        "and re-renders the changed route only, but state-of-the-world RDS still re-sends the one "
        "10,000-route table and Envoy rebuilds it for any change; the rest of the chain (guard, "
        "policy sets, snapshot assembly) still walks every route once per change. Scoped RDS over "
        "delta xDS (issue 14, part 3) is what removes the table rebuild."
    ),
    "publication.new_route_ratio": (
        "As for the 1-route change: a new route re-sends the whole route table over state-of-the-world "
        "RDS and every cluster over CDS."
    ),
    "publication.full_10000_floor_ratio": (
        "Above Envoy's own acceptance of the table, the full publication still pays the CP's inventory "
        "and event, the Link's guard and translation of every route, the authorization policy set's "
        "compilation and ACK, and the sync report, one after the other."
    ),
    "churn.non_2xx": "A non-2xx during churn is a correctness bug, not a performance gap.",
    "consumers.billed_added_p50_ms_one_conn": (
        "A billed request waits for one PostgreSQL round trip from a Check thread (psycopg 3, synchronous "
        "pool): 0.13-0.16 ms p50 unloaded, more while the same 2 cores run Envoy, wrk and PostgreSQL. "
        "Evidence: bench/PROFILE-quota.md."
    ),
    "consumers.opa_cpu_us_per_decision": (
        "Building the neutral input (headers, query, path segments) and handing it to regorus as JSON; "
        "a larger module or input costs more."
    ),
    "consumers.revocation_propagation_ms_max": (
        "A revocation travels CP → Link (a new generation) → the authorization policy set over ADS; "
        "a machine this loaded delays each hop."
    ),
}


def lookup(report: dict[str, Any], dotted: str) -> Any:
    node: Any = report
    for part in dotted.split("."):
        node = node[part]
    return node


def judge(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, label, unit, bound, kind in TARGETS:
        measured = float(lookup(report, key))
        met = measured >= bound if kind == "min" else measured <= bound
        entry: dict[str, Any] = {
            "target": f"{'≥' if kind == 'min' else '≤'} {bound:g}{unit and ' ' + unit}",
            "key": key,
            "label": label,
            "measured": measured,
            "met": met,
        }
        if not met:
            entry["missed_by"] = abs(measured - bound)
            entry["missed_by_ratio"] = (measured / bound) if bound else None
            entry["explanation"] = EXPLANATIONS[key]
        out.append(entry)
    return out


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines."""
    return [
        f"| {' | '.join(header)} |",
        "|" + "---|" * len(header),
        *(f"| {' | '.join(row)} |" for row in rows),
    ]


def summary_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# STOA benchmark — {report['date']}{' (BENCH_QUICK)' if report['quick'] else ''}",
        "",
        f"Machine: {env['machine']}; {env['cores']} cores, Envoy {env['envoy_version']}, commit "
        f"{env['git_commit'][:12]}"
        f"{' (dirty tree)' if env['git_dirty'] else ''}; everything on 127.0.0.1; load from wrk.",
        "",
        *_table(
            ("target", "measured", "bound", "met"),
            (
                (
                    t["label"],
                    _fmt(t["measured"]),
                    t["target"],
                    "yes" if t["met"] else f"NO (missed by {_fmt(t['missed_by'])})",
                )
                for t in report["targets"]
            ),
        ),
    ]
    missed = [t for t in report["targets"] if not t["met"]]
    if missed:
        lines += ["", "Targets not met, and what the profiles show:", ""]
        lines += [f"- **{t['label']}**: {t['explanation']}" for t in missed]
    dp = report["data_path"]
    lines += [
        "",
        f"Envoy deciding natively added {dp['native_added_p50_ms_one_conn']:.2f} ms p50 at one connection "
        f"(the service: {dp['added_p50_ms_one_conn']:.2f} ms); the no-op Check server ran at "
        f"{dp['noop_check_ratio']:.2f} x proxy-only.",
        "",
        f"Data path ({dp['connections']} connections, {dp['duration_s']:g} s x {dp['repetitions']}"
        " repetitions; min / median / max):",
        "",
        *_variants(
            dp["variants"],
            ("variant", "x proxy-only", "authz CPU µs/decision"),
            lambda s: _tri(s["ratio"]) if s.get("ratio") else "1",
            lambda s: _tri(s["authz_cpu_us_per_decision"]) if s.get("authz_cpu_us_per_decision") else "—",
        ),
    ]
    if "consumers" in report:
        lines += ["", consumers_markdown(report["consumers"]).rstrip("\n")]
    proc = report["processing"]
    lines += [
        "",
        f"Processing ({proc['body_bytes']} B JSON body, {proc['connections']} connections,"
        f" {proc['duration_s']:g} s x {proc['repetitions']} repetitions): guardrail route"
        f" {proc['proc_ratio']:.2f} x proxy-only, the no-op processor {proc['proc_noop_ratio']:.2f} x;"
        f" streamed completion at one connection: stoa-proc added {proc['proc_stream_added_ttfb_ms']:.2f} ms"
        f" to the first byte, the no-op processor {proc['noop_stream_added_ttfb_ms']:.2f} ms.",
    ]
    pub = report["publication"]
    lines += [
        "",
        "Publication (CP API call returned → route answers 200 through Envoy):",
        "",
        *_table(
            ("routes already published", "p50 ms", "p99 ms", "n"),
            (
                (
                    f"{int(count):,}",
                    _fmt(pub["new_route_p50_ms"][count]),
                    _fmt(p99),
                    str(len(pub["samples_ms"][count])),
                )
                for count, p99 in pub["new_route_p99_ms"].items()
            ),
        ),
        "",
        "Full publication of 10,000 routes (deploy-all in one generation → SYNCED):"
        f" {pub['full_10000_s']:.2f} s"
        f" (→ serving {pub['full_10000_serving_s']:.2f} s);"
        f" Envoy alone accepting the same routes as one table {pub['full_10000_floor_s']:.2f} s"
        f" (ratio {pub['full_10000_floor_ratio']:.2f}); Envoy RSS at 10,000 routes"
        f" {pub['envoy_rss_mib_10000']:.0f} MiB (one table: {pub['envoy_rss_mib_10000_one_table']:.0f} MiB).",
        f"1-route change at 10,000 routes: → SYNCED {_fmt(pub['one_change_10000_ms'])} ms,"
        f" → serving {_fmt(pub['one_change_10000_serving_ms'])} ms"
        f" (at 100: {_fmt(pub['one_change_100_serving_ms'])} ms; ratio {pub['one_change_ratio']:.2f});"
        f" event stream {pub['sse_bytes_one_change_10000']:,.0f} bytes for the change"
        f" (at 100: {pub['sse_bytes_one_change_100']:,.0f}).",
        f"Churn: {report['churn']['rounds']} rounds on {report['churn']['routes']} routes,"
        f" {report['churn']['requests']:,} requests, non-2xx {report['churn']['non_2xx']},"
        f" socket errors {report['churn']['socket_errors']}.",
        f"Footprint at 5,000 routes: Link RSS {report['footprint']['link_rss_mib_5000']:.1f} MiB,"
        f" Link CPU at rest {report['footprint']['link_cpu_percent_at_rest_5000']:.2f} % of a core;"
        f" metric series {report['footprint']['metric_series']:,}"
        f" (Envoy {report['footprint']['envoy_metric_series']:,},"
        f" Link {report['footprint']['link_metric_series']}).",
    ]
    return "\n".join(lines) + "\n"


def consumers_markdown(result: dict[str, Any]) -> str:
    """The consumers scenario's table: each route against the plain JWT route, all service-decided."""
    lines = [
        f"Consumers (decided by the authorization service; {result['connections']} connections,"
        f" {result['duration_s']:g} s x {result['repetitions']} repetitions; min / median / max):",
        "",
        *_variants(
            result["variants"],
            ("route", "x plain JWT", "authz CPU µs/Check"),
            lambda s: _tri(s["ratio_to_jwt"]),
            lambda s: _tri(s["authz_cpu_us_per_decision"]),
        ),
        "",
        f"Billed quota: {result['billed_added_p50_ms_one_conn']:.2f} ms added p50 at one connection."
        f" OPA decision: {result['opa_cpu_us_per_decision']:.0f} µs CPU in process"
        f" ({result['opa_added_authz_cpu_us_per_check']:.0f} µs more authz CPU per Check than the key route)."
        f" Key revocation → 401 through Envoy: median {result['revocation_propagation_ms']:.0f} ms,"
        f" max {result['revocation_propagation_ms_max']:.0f} ms.",
    ]
    return "\n".join(lines) + "\n"


def _tri(s: dict[str, float]) -> str:
    return f"{_fmt(s['min'])} / {_fmt(s['median'])} / {_fmt(s['max'])}"


def _variants(
    variants: dict[str, Any],
    names: tuple[str, str, str],
    ratio: Callable[[dict[str, Any]], str],
    cpu: Callable[[dict[str, Any]], str],
) -> list[str]:
    """The table of a load scenario's variants: min / median / max of each figure over repetitions
    (`names`: the variant column's, the ratio's and the CPU's)."""
    first, ratio_name, cpu_name = names
    return _table(
        (first, "rps", ratio_name, "p50 ms", "p99 ms", cpu_name),
        (
            (f"{n}", _tri(s["rps"]), ratio(s), _tri(s["p50_ms"]), _tri(s["p99_ms"]), cpu(s))
            for n, s in variants.items()
        ),
    )


def _saved(fig: Any, out: Path, name: str) -> str:
    """The figure written to `out/name` (and its memory freed): its name."""
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def plots(report: dict[str, Any], out: Path) -> list[str]:
    written = []
    dp = report["data_path"]["variants"]
    names = list(dp)
    fig, ax = plt.subplots(figsize=(9, 4))
    med = [dp[n]["rps"]["median"] for n in names]
    err = [
        [m - dp[n]["rps"]["min"] for n, m in zip(names, med, strict=True)],
        [dp[n]["rps"]["max"] - m for n, m in zip(names, med, strict=True)],
    ]
    ax.bar(names, med, yerr=err, capsize=4, color=["#888"] + ["#3a7"] * (len(names) - 1))
    ax.set_ylabel("requests/s (median, min-max)")
    ax.set_title("Data path throughput")
    ax.tick_params(axis="x", rotation=30)
    written.append(_saved(fig, out, "data_path_rps.png"))

    fig, ax = plt.subplots(figsize=(9, 4))
    for i, key in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        ax.bar(
            [x + i * 0.27 for x in range(len(names))],
            [dp[n][key]["median"] for n in names],
            width=0.27,
            label=key.removesuffix("_ms"),
        )
    ax.set_xticks([x + 0.27 for x in range(len(names))], names, rotation=30)
    ax.set_ylabel("latency ms (median of repetitions)")
    ax.set_title("Data path latency")
    ax.legend()
    written.append(_saved(fig, out, "data_path_latency.png"))

    pub = report["publication"]
    counts = list(pub["samples_ms"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot([pub["samples_ms"][c] for c in counts], tick_labels=[f"{int(c):,}" for c in counts])
    ax.axhline(150, color="red", linestyle="--", linewidth=1, label="target p99 at 3,000 (150 ms)")
    ax.set_xlabel("routes already published")
    ax.set_ylabel("ms to serving")
    ax.set_title("New route: CP API call → 200 through Envoy")
    ax.legend()
    written.append(_saved(fig, out, "publication.png"))
    return written


def write(report: dict[str, Any], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    report["targets"] = judge(report)
    report["plots"] = ["data_path_rps.png", "data_path_latency.png", "publication.png"]
    # The numbers first: a plotting failure must not lose a run.
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    plots(report, out)
    text = summary_markdown(report)
    (out / "summary.md").write_text(text)
    return text
