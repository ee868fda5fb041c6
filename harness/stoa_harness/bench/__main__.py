"""`python -m stoa_harness.bench`: every scenario in one estate, then the report.

Order: data path (one route) → consumers (key, billed-quota and OPA routes against the plain JWT
route; revocation propagation) → processing (a guardrail route, a streamed completion) → churn
(100 routes) → publication ladder 100 / 1,000 / 3,000 routes
(footprint at 5,000) / 10,000, then the 1-route change and the full publication at 10,000.
`BENCH_QUICK=1`: the same route counts and report keys, fewer repetitions and shorter load phases
(under 5 minutes on 2 cores). Results go to `bench/results/<date>/` at the repository root
(`BENCH_RESULTS_DIR` overrides), and the summary table is printed.
`BENCH_ONLY=data_path`: the data-path scenario alone (for work on the authorization hop); it writes
`data_path.json` (the `data_path` section of the report) instead of the full report.
`BENCH_ONLY=consumers`: the consumers scenario alone; it writes `consumers.json`.
`BENCH_ONLY=processing`: the processing scenario alone; it writes `processing.json`.
`BENCH_ONLY=publication`: the publication ladder alone (with the footprint taken on the way); it writes
`publication.json`. `BENCH_RUN_DIR=DIR` keeps the estate's logs (CP, Link, Envoy) in DIR.
`BENCH_ONLY=mcp`: a `tools/call` through Envoy, stoa-authz and stoa-mcp against a direct call of its API
(`stoa_harness.bench.mcp_call`); it writes `mcp.json`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoa_harness.bench import (
    churn,
    consumers,
    data_path,
    footprint,
    mcp_call,
    processing,
    publication,
    report,
)
from stoa_harness.bench.rig import Rig

REPO = Path(__file__).resolve().parents[3]
LADDER = (100, 1_000, 3_000, 10_000)
FOOTPRINT_ROUTES = 5_000


@dataclass(frozen=True)
class Plan:
    quick: bool
    reps: int  # data-path repetitions per variant (each with its own proxy-only baseline)
    load_s: float  # one wrk phase
    one_conn_s: float
    publications: int  # new-route samples per route count
    changes: int  # 1-route change samples at 10,000
    full: int  # full-publication samples
    rest_window_s: float  # footprint CPU window
    proc_reps: int  # processing repetitions (each variant with its own proxy-only baseline)
    ttfb_count: int  # streamed completions per time-to-first-byte sample


FULL = Plan(
    quick=False,
    reps=5,
    load_s=10,
    one_conn_s=5,
    publications=20,
    changes=5,
    full=3,
    rest_window_s=10,
    proc_reps=3,
    ttfb_count=100,
)
QUICK = Plan(
    quick=True,
    reps=3,
    load_s=2,
    one_conn_s=2,
    publications=5,
    changes=3,
    full=2,
    rest_window_s=3,
    proc_reps=2,
    ttfb_count=40,
)


def _data_path(rig: Rig, plan: Plan) -> dict[str, Any]:
    return data_path.run(rig, reps=plan.reps, duration_s=plan.load_s, one_conn_duration_s=plan.one_conn_s)


def _consumers(rig: Rig, plan: Plan) -> dict[str, Any]:
    return consumers.run(rig, reps=plan.reps, duration_s=plan.load_s, one_conn_duration_s=plan.one_conn_s)


def _processing(rig: Rig, plan: Plan) -> dict[str, Any]:
    return processing.run(rig, reps=plan.proc_reps, duration_s=plan.load_s, ttfb_count=plan.ttfb_count)


def _churn(rig: Rig, _plan: Plan) -> dict[str, Any]:
    return churn.run(rig)


# The scenarios before the publication ladder, in the order they run.
SCENARIOS: dict[str, Callable[[Rig, Plan], dict[str, Any]]] = {
    "data_path": _data_path,
    "consumers": _consumers,
    "processing": _processing,
    "churn": _churn,
}


def run(plan: Plan, run_dir: Path, only: tuple[str, ...] = tuple(SCENARIOS)) -> dict[str, Any]:
    started = time.monotonic()
    phases: dict[str, float] = {}
    out: dict[str, Any] = {}
    with Rig(run_dir) as rig:
        mark = time.monotonic()
        # `only` = () runs the publication ladder alone (BENCH_ONLY=publication).
        for name, scenario in SCENARIOS.items():
            if name in only:
                out[name] = scenario(rig, plan)
                phases[name], mark = time.monotonic() - mark, time.monotonic()
        ladder = publication.Ladder(rig)
        samples: dict[int, list[float]] = {}
        for count in LADDER:
            if count > FOOTPRINT_ROUTES and "footprint" not in out:
                ladder.grow_to(FOOTPRINT_ROUTES)
                out["footprint"] = footprint.run(rig, window_s=plan.rest_window_s)
            ladder.grow_to(count)
            samples[count] = ladder.new_routes(plan.publications)
            if count == LADDER[0]:
                change_small = ladder.one_change(plan.changes, tag=str(count))
            print(
                f"bench: {count:,} routes: new route p99 {report.percentile(samples[count], 99):.0f} ms",
                file=sys.stderr,
            )
        change = ladder.one_change(plan.changes, tag=str(LADDER[-1]))
        full = ladder.full(plan.full)
        floor = ladder.floor(plan.full)
        out["publication"] = publication.summarise(samples, change, full, change_small, floor, rig.xds)
        phases["publication_and_footprint"] = time.monotonic() - mark
    out["phase_seconds"] = phases
    out["total_seconds"] = time.monotonic() - started
    return out


def _data_path_summary(result: dict[str, Any]) -> str:
    lines = []
    for name, s in result["variants"].items():
        ratio = f"  ratio {s['ratio']['median']:.3f}" if "ratio" in s else ""
        cpu = s.get("authz_cpu_us_per_decision")
        cpu_text = f"  cpu/decision {cpu['median']:.0f} us" if cpu else ""
        split = " ".join(f"{k}={v['median']:.2f}" for k, v in s["cpu_split"].items())
        lines.append(
            f"{name:18s} rps {s['rps']['median']:7.0f}  p50 {s['p50_ms']['median']:.2f} ms"
            f"{ratio}{cpu_text}  cores: {split}"
        )
    lines.append(f"added p50 at one connection: {result['added_p50_ms_one_conn']:.3f} ms")
    return "\n".join(lines)


def _processing_summary(result: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in result.items() if k not in ("ttfb", "variants")}, indent=2)


def _publication_summary(results: dict[str, Any]) -> str:
    pub = {k: v for k, v in results["publication"].items() if "samples" not in k and k != "definition"}
    return json.dumps(pub, indent=2)


# What a scenario run alone prints of its result.
SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "data_path": _data_path_summary,
    "consumers": report.consumers_markdown,
    "processing": _processing_summary,
    "publication": _publication_summary,
}


def _written(name: str, result: dict[str, Any], target: Path) -> None:
    """`<name>.json` in `target`, and the scenario's summary printed."""
    target.mkdir(parents=True, exist_ok=True)
    (target / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(SUMMARIES[name](result))
    print(f"{name}: {target / f'{name}.json'}")


def run_alone(name: str, plan: Plan, run_dir: Path, target: Path) -> None:
    """One scenario in an estate of its own (BENCH_ONLY=<name>)."""
    with Rig(run_dir) as rig:
        result = SCENARIOS[name](rig, plan)
    _written(name, result, target)


def main() -> int:
    plan = QUICK if os.environ.get("BENCH_QUICK", "") not in ("", "0") else FULL
    date = datetime.date.today().isoformat()
    target = Path(os.environ.get("BENCH_RESULTS_DIR") or REPO / "bench" / "results" / date)
    only = os.environ.get("BENCH_ONLY", "")
    if only not in ("", "data_path", "consumers", "processing", "publication", "mcp"):
        print(
            f"BENCH_ONLY={only!r}: only 'data_path', 'consumers', 'processing', 'publication' or 'mcp'"
            " can run alone",
            file=sys.stderr,
        )
        return 2
    if only == "mcp":
        return mcp_call.main()
    keep = os.environ.get("BENCH_RUN_DIR", "")
    if only in ("data_path", "consumers", "processing"):
        with tempfile.TemporaryDirectory(prefix="stoa-bench-") as tmp:
            run_alone(only, plan, Path(keep or tmp), target)
        return 0
    with contextlib.ExitStack() as stack:
        run_dir = (
            Path(keep)
            if keep
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stoa-bench-")))
        )
        results = run(plan, run_dir, () if only else tuple(SCENARIOS))
    results = {"date": date, "quick": plan.quick, "environment": report.environment(REPO), **results}
    if only == "publication":
        _written("publication", results, target)
        return 0
    text = report.write(results, target)
    print(text)
    print(f"report: {target / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
