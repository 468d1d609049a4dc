"""The result of ``dpda bench load``: the dict it writes (``REQUIRED_KEYS`` first) from what
the run recorded, and the summary it prints."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from tests.bench.load_honest import DATASET_CAP, DELTA, PEER_CAP, TARGET_BUDGET, Recorder, Workload

if TYPE_CHECKING:
    from tests.bench.load import RssSampler

PINNED_KINDS = ("hint ", "pate ", "plan ")  # bench.hostile's patterns of a pinned peer
REQUIRED_KEYS = ("sessions", "errors", "p50_ms", "p99_ms", "peak_rss_mb", "hostile_requests")


def percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    a = np.asarray(ms)
    return {
        "n": int(a.size),
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
        "max_ms": round(float(a.max()), 3),
    }


def load_result(
    rec: Recorder,
    sampler: RssSampler,
    flood: dict[str, Any],
    *,
    duration: float,
    sessions: int,
    peers: int,
    wall: float,
    stuck: int,
    peak_kb: int,
    rss_kb: tuple[int, int],
    cpu: dict[str, Any],
    refusals: Any,
    ledger: tuple[list[str], list[str], int, float],
    work: Workload,
    hostile_nice: int | None,
) -> dict[str, Any]:
    """The result dict (``REQUIRED_KEYS`` first) from what the run recorded."""
    problems, warnings, n_entries, last_spend = ledger
    hostile_codes: dict[str, int] = flood.get("codes", {})
    all_ms = [ms for v in rec.rpc_ms.values() for ms in v]
    overall = percentiles(all_ms)
    n_err = len(rec.errors) + stuck
    out: dict[str, Any] = {
        "benchmark": "load",
        "sessions": sessions,
        "errors": n_err,
        "p50_ms": overall["p50_ms"],
        "p99_ms": overall["p99_ms"],
        "peak_rss_mb": round(peak_kb / 1024.0, 1),
        "hostile_requests": int(sum(hostile_codes.values())),
        "duration_s": duration,
        "wall_s": round(wall, 2),
        "peers": peers,
        "honest_rpcs": overall["n"],
        "rpc_timing": rec.timing,
        "rpc_max_ms": overall["max_ms"],
        "sessions_opened": rec.counts["sessions_opened"],
        "sessions_closed": rec.counts["sessions_closed"],
        "releases": rec.counts["releases"],
        "pate_calls": rec.counts["pate_calls"],
        "pate_queries": rec.counts["pate_queries"],
        "releases_per_s": round(rec.counts["releases"] / wall, 2),
        "rpcs_per_s": round(overall["n"] / wall, 2),
        "retries": dict(rec.retries),
        "honest_refusals": dict(rec.rpc_refused),
        "latency_by_method": {m: percentiles(v) for m, v in sorted(rec.rpc_ms.items())},
        "latency_by_operation": {k: percentiles(v) for k, v in sorted(rec.op_ms.items())},
        "error_messages": rec.errors[:20] + (["a client did not finish"] if stuck else []),
        "hostile_codes": dict(sorted(hostile_codes.items())),
        "hostile_served": sum(
            v
            for k, v in hostile_codes.items()
            if k.endswith(" OK")
            and not k.endswith(" Check OK")
            and not k.startswith(PINNED_KINDS)  # a pinned peer's own requests are served
        ),
        "hostile_mb_sent": round(flood.get("bytes", 0) / 2**20, 1),
        "hostile_requests_per_s": round(sum(hostile_codes.values()) / wall, 1),
        "hostile_nice": hostile_nice,
        "source_refusals": refusals,
        "cpu_s": cpu,
        "rss_mb": {
            "start": round(rss_kb[0] / 1024.0, 1),
            "max_sampled": round(max(sampler.samples, default=0) / 1024.0, 1),
            "end": round(rss_kb[1] / 1024.0, 1),
            "samples": len(sampler.samples),
        },
        "ledger": {
            "entries": n_entries,
            "epsilon_spent": last_spend,
            "verify_problems": problems[:10],
            "verify_warnings": len(warnings),
        },
        "workload": {
            **work.__dict__,
            "dataset_cap": DATASET_CAP,
            "peer_cap": PEER_CAP,
            "target_budget": TARGET_BUDGET,
            "delta": DELTA,
            "note": "caps set high for a load test (dataset cap: the config's maximum, 100): "
            "the honest sessions never run out of ε",
        },
    }
    return out


def print_summary(out: dict[str, Any], file: Any = None) -> None:
    file = file or sys.stdout
    w = out["workload"]

    def p(line: str = "") -> None:
        print(line, file=file)

    p(
        f"load: {out['sessions']} honest sessions over {out['peers']} peer(s), "
        f"{out['duration_s']:g} s (wall {out['wall_s']:.1f} s), hostile client "
        f"{'on' if out['hostile_requests'] else 'off'}"
    )
    p(
        f"  each session: {w['steps']} minibatch releases + {w['pate_calls']} × "
        f"{w['pate_batch']} PATE queries; caps ε {w['dataset_cap']:g} (dataset), "
        f"{w['peer_cap']:g} (peer): set high for a load test"
    )
    p()
    p(f"  {'honest':<22} {'n':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for group in ("latency_by_method", "latency_by_operation"):
        for name, s in out[group].items():
            label = name if group == "latency_by_method" else f"op:{name}"
            p(
                f"  {label:<22} {s['n']:>8} {s['p50_ms']:>9.1f} {s['p99_ms']:>9.1f} "
                f"{s['max_ms']:>9.1f}"
            )
    p(
        f"  {'all RPCs':<22} {out['honest_rpcs']:>8} {out['p50_ms']:>9.1f} "
        f"{out['p99_ms']:>9.1f} {out['rpc_max_ms']:>9.1f}"
    )
    p()
    p(
        f"  sessions {out['sessions_opened']} opened / {out['sessions_closed']} closed, "
        f"{out['releases']} releases ({out['releases_per_s']:.1f}/s), {out['pate_calls']} "
        f"PATE calls ({out['pate_queries']} queries), {out['rpcs_per_s']:.1f} RPC/s"
    )
    retries = ", ".join(f"{k} {v}" for k, v in sorted(out["retries"].items())) or "none"
    p(f"  retries (protocol, not errors): {retries}")
    p(f"  honest errors: {out['errors']}")
    for m in out["error_messages"][:5]:
        p(f"    {m}")
    p(
        f"  hostile requests: {out['hostile_requests']} ({out['hostile_requests_per_s']:.0f}/s, "
        f"{out['hostile_mb_sent']:.0f} MB sent, nice {out['hostile_nice']}); served beyond the "
        f"health check open to any TLS client: {out['hostile_served']}"
    )
    for k, v in out["hostile_codes"].items():
        p(f"    {k:<40} {v:>8}")
    refusals = ", ".join(f"{k} {int(v)}" for k, v in sorted(out["source_refusals"].items()))
    p(f"  source refusals: {refusals or 'n/a'}")
    r = out["rss_mb"]
    p(
        f"  source RSS: peak {out['peak_rss_mb']:.1f} MB (VmHWM), start {r['start']:.1f}, "
        f"max sampled {r['max_sampled']:.1f}, end {r['end']:.1f} MB"
    )
    c = out["cpu_s"]
    p(
        f"  CPU seconds: source {c['source']:.1f}, honest clients {c['honest_clients']:.1f}, "
        f"hostile client {c['hostile_client']:.1f} ({c['cores']} cores; machine load "
        f"{c['loadavg_1min'][0]:.1f} → {c['loadavg_1min'][1]:.1f})"
    )
    lg = out["ledger"]
    p(
        f"  source ledger: {lg['entries']} entries, ε spent {lg['epsilon_spent']:.3f}, "
        f"verify: {len(lg['verify_problems'])} problem(s), {lg['verify_warnings']} warning(s)"
    )
