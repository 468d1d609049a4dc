"""The job report: one self-contained HTML page with inline SVG plots, axes with round ticks.

Drawn here rather than with matplotlib on purpose: the report is built on daemon hosts, which do
not install the ``bench`` extra (matplotlib draws only the benchmarks' PNG figures).

The page reads as this job's: who (job id, dataset, peer, time), the accuracy, this job's ε and
the totals for both parties apart with the budget that applies, any ``adaptation`` / baselines
block the results hold, then the plots: this job's ε after each release against its budget; the
classes' shares (the source's noisy counts, the target rows predicted in each); a 2-D view (the
target's top two principal directions) of target rows and mapped source rows, with a legend per
class; for sinkhorn-synthetic, the released synthetic points beside the target's rows. Every
other value of the results follows, formatted.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]
W, H, PAD = 520, 300, 44


def _axes(title: str, xlabel: str, ylabel: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img">',
        f"<title>{html.escape(title)}</title>",
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="14">{html.escape(title)}</text>',
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="24" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
        f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle" font-size="12">'
        f"{html.escape(xlabel)}</text>",
        f'<text x="12" y="{H / 2}" font-size="12" transform="rotate(-90 12 {H / 2})" '
        f'text-anchor="middle">{html.escape(ylabel)}</text>',
    ]


def _scale(v: np.ndarray, lo: float, hi: float, out_lo: float, out_hi: float) -> np.ndarray:
    span = hi - lo if hi > lo else 1.0
    return out_lo + (v - lo) / span * (out_hi - out_lo)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values (1, 2 or 5 × 10^k apart) covering [lo, hi]."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo:
        return [float(lo)] if np.isfinite(lo) else []
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10.0 ** np.floor(np.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 5.0, 10.0) if m * mag >= raw)
    first = np.ceil(lo / step - 1e-9) * step
    return [float(round(v, 12)) for v in np.arange(first, hi + step * 1e-9, step)]


def integer_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round whole numbers covering [lo, hi] (releases, classes: never 0.5)."""
    ticks = [t for t in nice_ticks(lo, hi, n) if float(t).is_integer()]
    if len(ticks) < 2:
        ticks = [float(v) for v in range(int(np.ceil(lo)), int(np.floor(hi)) + 1)]
    return ticks


def _tick_label(v: float) -> str:
    if abs(v) < 1e-12:  # never "-0"
        return "0"
    return f"{v:.3g}"


def fmt(v: Any) -> str:
    """A value as a reader wants it: 4 significant digits, no float noise, no Python reprs."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | np.integer):
        return f"{int(v):,}"
    if isinstance(v, float | np.floating):
        f = float(v)
        if not np.isfinite(f):
            return str(f)
        if f == 0:
            return "0"
        if abs(f) >= 1e5 or abs(f) < 1e-3:
            return f"{f:.3e}"
        return f"{f:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {fmt(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return ", ".join(fmt(x) for x in v)
    return str(v)


def _xticks(
    parts: list[str], lo: float, hi: float, x0: float, x1: float, whole: bool = False
) -> None:
    for v in integer_ticks(lo, hi) if whole else nice_ticks(lo, hi):
        x = float(_scale(np.array(v), lo, hi, x0, x1))
        parts.append(
            f'<line x1="{x:.1f}" y1="{H - PAD}" x2="{x:.1f}" y2="{H - PAD + 4}" stroke="black"/>'
            f'<text x="{x:.1f}" y="{H - PAD + 15}" text-anchor="middle" font-size="10">'
            f"{_tick_label(v)}</text>"
        )


def _yticks(parts: list[str], lo: float, hi: float, y0: float, y1: float) -> None:
    for v in nice_ticks(lo, hi):
        y = float(_scale(np.array(v), lo, hi, y0, y1))
        parts.append(
            f'<line x1="{PAD - 4}" y1="{y:.1f}" x2="{PAD}" y2="{y:.1f}" stroke="black"/>'
            f'<text x="{PAD - 6}" y="{y + 3:.1f}" text-anchor="end" font-size="10">'
            f"{_tick_label(v)}</text>"
        )


def line_chart(
    ys: list[float],
    cap: float,
    title: str,
    cap_label: str | None = None,
    xs_at: list[int] | None = None,
) -> str:
    """ε after each release (``xs_at``: the releases the values belong to; default 1…n), with
    the budget that applies as a dashed line labelled ``cap_label``."""
    parts = _axes(title, "release", "ε")
    n = len(ys)
    at = [float(x) for x in (xs_at or range(1, n + 1))]
    last = max([1.0, *at])
    top = max([cap, *ys]) * 1.08 if ys else 1.0
    xs = _scale(np.asarray(at, dtype=float), 0.0, last, PAD, W - 20)
    yv = _scale(np.asarray(ys, dtype=float), 0.0, top, H - PAD, 30)
    cap_y = float(_scale(np.array([cap]), 0.0, top, H - PAD, 30)[0])
    parts.append(
        f'<line x1="{PAD}" y1="{cap_y:.1f}" x2="{W - 10}" y2="{cap_y:.1f}" '
        'stroke="#d62728" stroke-dasharray="4 3"/>'
    )
    label = cap_label or f"budget {cap:g}"
    parts.append(
        f'<text x="{W - 12}" y="{cap_y - 4:.1f}" text-anchor="end" font-size="11" '
        f'fill="#d62728">{html.escape(label)}</text>'
    )
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, yv, strict=True))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for x, y, v in zip(xs, yv, ys, strict=True):
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#1f77b4">'
            f"<title>{v:.4f}</title></circle>"
        )
    _xticks(parts, 0.0, last, PAD, W - 20, whole=True)
    _yticks(parts, 0.0, top, H - PAD, 30)
    return "".join(parts) + "</svg>"


def bar_chart(
    noisy: list[float],
    used: list[float],
    title: str,
    names: tuple[str, str] = ("noisy count", "rows labelled"),
    unit: str = "rows",
) -> str:
    """Two values per class side by side (orange: ``names[0]``, blue: ``names[1]``)."""
    parts = _axes(title, "class", unit)
    q = len(noisy)
    top = max([1e-9, *noisy, *used]) * 1.15
    bw = (W - PAD - 20) / max(q, 1) / 2.5
    for c in range(q):
        x0 = PAD + 8 + c * (W - PAD - 20) / max(q, 1)
        for k, (v, color) in enumerate(((noisy[c], "#ff7f0e"), (used[c], "#1f77b4"))):
            h = max(0.0, v) / top * (H - PAD - 30)
            parts.append(
                f'<rect x="{x0 + k * bw:.1f}" y="{H - PAD - h:.1f}" width="{bw:.1f}" '
                f'height="{h:.1f}" fill="{color}"><title>{fmt(v)}</title></rect>'
            )
        parts.append(
            f'<text x="{x0 + bw:.1f}" y="{H - PAD + 14}" text-anchor="middle" '
            f'font-size="10">{c}</text>'
        )
    parts.append(
        '<rect x="60" y="26" width="10" height="10" fill="#ff7f0e"/>'
        f'<text x="74" y="35" font-size="11">{html.escape(names[0])}</text>'
        '<rect x="60" y="40" width="10" height="10" fill="#1f77b4"/>'
        f'<text x="74" y="49" font-size="11">{html.escape(names[1])}</text>'
    )
    _yticks(parts, 0.0, top, H - PAD, 30)
    return "".join(parts) + "</svg>"


LEGEND_STEP, LEGEND_ROW = 54, 14  # px between swatches, and between the legend's rows
LEGEND_PER_ROW = (W - 60 - 16) // LEGEND_STEP  # every swatch and its label inside the plot


def legend_swatch(i: int) -> tuple[int, int]:
    """(x, y) of the top left of the ``i``-th class's swatch in a scatter's legend: rows of
    ``LEGEND_PER_ROW`` from the plot's top left, so that every class is shown in full."""
    row, col = divmod(i, LEGEND_PER_ROW)
    return 60 + col * LEGEND_STEP, 43 + row * LEGEND_ROW


def scatter(
    target: np.ndarray,
    t_lab: np.ndarray,
    mapped: np.ndarray,
    m_lab: np.ndarray,
    title: str,
    max_points: int = 1500,
    legend: str = "dots: target rows · crosses: mapped source rows · colour: class",
) -> str:
    parts = _axes(title, "principal direction 1", "principal direction 2")
    both = np.vstack([target, mapped]) if mapped.size else target
    lo, hi = both.min(axis=0), both.max(axis=0)
    rng = np.random.default_rng(0)

    def pick(n: int) -> np.ndarray:
        return rng.choice(n, min(n, max_points), replace=False) if n else np.zeros(0, int)

    for pts, labels, shape in ((target, t_lab, "circle"), (mapped, m_lab, "cross")):
        for i in pick(pts.shape[0]):
            x = float(_scale(pts[i, 0], lo[0], hi[0], PAD + 6, W - 16))
            y = float(_scale(pts[i, 1], lo[1], hi[1], H - PAD - 6, 30))
            color = PALETTE[int(labels[i]) % len(PALETTE)] if labels is not None else "#999"
            if shape == "circle":
                parts.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{color}" fill-opacity="0.35"/>'
                )
            else:
                parts.append(
                    f'<path d="M{x - 3:.1f},{y:.1f}h6M{x:.1f},{y - 3:.1f}v6" '
                    f'stroke="{color}" stroke-width="1.5"/>'
                )
    parts.append(f'<text x="60" y="37" font-size="11">{html.escape(legend)}</text>')
    classes = sorted({int(c) for lab in (t_lab, m_lab) if lab is not None for c in np.unique(lab)})
    for i, c in enumerate(classes):  # one swatch per class, in the plot's colours
        x, y = legend_swatch(i)
        parts.append(
            f'<rect x="{x}" y="{y}" width="10" height="10" fill="{PALETTE[c % len(PALETTE)]}"/>'
            f'<text x="{x + 13}" y="{y + 9}" font-size="10">class {c}</text>'
        )
    _xticks(parts, float(lo[0]), float(hi[0]), PAD + 6, W - 16)
    _yticks(parts, float(lo[1]), float(hi[1]), H - PAD - 6, 30)
    return "".join(parts) + "</svg>"


_SHOWN_APART = {
    "predictions_sha256",
    "caveat",
    "accuracy",
    "adaptation",
    "baselines",
    "spread",
    "selection",
    "choice",
}
RUNNING_TOTAL = "ε spent on the source's dataset in all (its running total, every job)"
# keys whose bare name misleads: the ε of one job beside the dataset's running total
LABELS = {
    "epsilon_job": "ε this job",
    "epsilon_spent": RUNNING_TOTAL,
    "epsilon_dataset_total": RUNNING_TOTAL,
    "epsilon_budget": "ε this job may spend",
    "epsilon_dataset_cap": "ε cap of the source's dataset (over every job)",
    "target_epsilon_spent": "ε this job, the target's own rows",
    "target_epsilon_total": "ε spent on the target's own rows in all (every job)",
    "target_epsilon_cap": "ε cap of the target's own rows (over every job)",
}


def render(summary: dict[str, Any], figures: dict[str, Any]) -> str:
    """The report page. ``figures`` holds the arrays; ``summary`` the numbers of results.json.

    Whatever keys the results hold are shown: who and what the job was, this job's ε and the
    totals for both parties apart, the accuracy (one number, or one per arm), an
    ``adaptation`` / ``baselines`` block when present, the plots, then every other value,
    formatted."""
    svgs = [_spend_chart(summary, figures)]
    if figures.get("noisy_counts"):
        noisy = np.sum(np.array(figures["noisy_counts"]), axis=0).astype(float)
        pred = figures.get("predicted_counts")
        if pred is not None:
            other = np.zeros(noisy.size)
            got = np.asarray(pred, dtype=float)[: noisy.size]
            other[: got.size] = got
            names = ("source rows, from its noisy class counts", "target rows predicted as it")
        else:  # older results: the labels of the rows the transport used
            other = np.bincount(figures["mapped_labels"], minlength=noisy.size)[: noisy.size]
            other = other.astype(float)
            names = ("source rows, from its noisy class counts", "source points transported")
        share = [100 * noisy / max(noisy.sum(), 1e-12), 100 * other / max(other.sum(), 1e-12)]
        svgs.append(
            bar_chart(
                share[0].tolist(), share[1].tolist(), "classes: share of rows (%)", names, "%"
            )
        )
    if figures.get("target_2d") is not None:
        svgs.append(
            scatter(
                figures["target_2d"],
                figures["target_labels"],
                figures["mapped_2d"],
                figures["mapped_labels"],
                "target rows and mapped source rows (2-D)",
            )
        )
    if figures.get("synthetic_2d") is not None:
        svgs.append(
            scatter(
                figures["target_projected_2d"],
                figures["target_labels"],
                figures["synthetic_2d"],
                figures["synthetic_labels"],
                "target rows and the source's synthetic points (projected space, 2-D)",
                legend="dots: target rows · crosses: released synthetic points · colour: class",
            )
        )
    # the ε values first, side by side with their labels; the running total once
    eps = [k for k in LABELS if k in summary]
    if "epsilon_spent" in summary and summary.get("epsilon_dataset_total") == summary.get(
        "epsilon_spent"
    ):
        eps.remove("epsilon_dataset_total")
    order = eps + [k for k in summary if k not in LABELS]
    rows = "".join(
        f"<tr><th>{html.escape(_label(k))}</th><td>{html.escape(fmt(summary[k]))}</td></tr>"
        for k in order
        if k not in _SHOWN_APART
    )
    blocks = "".join(
        _block(name, {k: v for k, v in summary[name].items() if k != "choice"})
        for name in ("adaptation", "baselines", "spread")
        if isinstance(summary.get(name), dict)
    )
    choice = summary.get("choice") or (summary.get("adaptation") or {}).get("choice")
    if isinstance(choice, dict):
        blocks += choice_table(choice)
    if isinstance(summary.get("selection"), dict):
        blocks += selection_table(summary["selection"])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>dpda job report</title>"
        "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}"
        "table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #ccc;"
        "padding:4px 8px;text-align:left;font-size:13px}td.n{text-align:right}"
        "svg{margin:8px;border:1px solid #eee}.who{color:#444}</style></head>"
        f"<body><h1>dpda job report</h1>{_who(summary)}"
        f"<p><b>Accuracy on the target:</b> {_accuracy(summary.get('accuracy'))}</p>"
        f"{_privacy(summary)}"
        f"<h2>Plots</h2><div>{''.join(svgs)}</div>{blocks}"
        f"<p><i>{html.escape(str(summary.get('caveat', '')))}</i></p>"
        f"<h2>Every value of results.json</h2><table>{rows}</table></body></html>"
    )


_WHO = (
    ("job_id", "job"),
    ("dataset", "dataset"),
    ("source", "source (peer)"),
    ("method", "method"),
    ("release", "release"),
    ("privacy_unit", "privacy unit"),
    ("finished_at", "finished"),
)


def _who(summary: dict[str, Any]) -> str:
    items = [f"<b>{label}</b> {html.escape(fmt(summary[k]))}" for k, label in _WHO if k in summary]
    return f"<p class='who'>{' · '.join(items)}</p>" if items else ""


def _label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " "))


def _accuracy(acc: Any) -> str:
    if acc is None:
        return "not measured (the target has no labels)"
    if isinstance(acc, dict):
        scored = {k: v for k, v in acc.items() if v is not None}
        if not scored:
            return "not measured (the target has no labels)"
        return ", ".join(f"{html.escape(_label(k))} {fmt(v)}%" for k, v in scored.items())
    return f"{fmt(acc)}%"


def _privacy(s: dict[str, Any]) -> str:
    """This job's ε and the totals, for each party apart, with the budget that applies."""
    job = s.get("epsilon_job", s.get("epsilon_spent"))
    total = s.get("epsilon_dataset_total", s.get("epsilon_spent"))
    budget = s.get("epsilon_budget")
    cap = s.get("epsilon_dataset_cap")
    terms = [f"cap ε {fmt(cap)} over every job"] if cap is not None else []
    if budget is not None:
        terms.append(f"this job may spend ε {fmt(budget)}")
    src = (
        f"<tr><th>the source's records (δ = {fmt(s.get('delta'))})</th>"
        f"<td class='n'>{fmt(job)}</td><td class='n'>{fmt(total)}</td>"
        f"<td>{'; '.join(terms) or '—'}</td></tr>"
    )
    by_source = s.get("epsilon_spent_by_source")
    if isinstance(by_source, dict):  # a job over several sources: one row for each
        jobs = s.get("epsilon_job_by_source") or {}
        src = "".join(
            _source_row(name, jobs.get(name), spent, s) for name, spent in by_source.items()
        )
    t_job = s.get("target_epsilon_spent")
    if s.get("target_disclosures") == "none":
        tgt = (
            "<tr><th>the target's own rows</th><td colspan='3'>ε 0: nothing of them was sent "
            "(the release was computed in the source's own space)</td></tr>"
        )
    elif t_job is None:
        tgt = (
            "<tr><th>the target's own rows</th><td colspan='3'>its statistics went out exactly "
            "(its opt-in: not protected)</td></tr>"
        )
    else:
        cap = s.get("target_epsilon_cap")
        t_delta = s.get("target_delta")
        delta_txt = f" (δ = {fmt(t_delta)})" if t_delta is not None else ""
        tgt = (
            f"<tr><th>the target's own rows{delta_txt}</th><td class='n'>{fmt(t_job)}</td>"
            f"<td class='n'>{fmt(s.get('target_epsilon_total', t_job))}</td>"
            f"<td>{'cap ε ' + fmt(cap) + ' over every job' if cap is not None else '—'}</td></tr>"
        )
    return (
        "<h2>Privacy</h2><table><tr><th></th><th>ε this job</th>"
        "<th>ε in all, every job (the running total after this one)</th>"
        f"<th>the budget that applies</th></tr>{src}{tgt}</table>"
    )


def _source_row(name: str, job: Any, total: Any, s: dict[str, Any]) -> str:
    """One source's row of a job over several sources: its records' ε, this job's and its
    running total, or why they are not known here (it left the job)."""
    who = f"source {html.escape(name)}'s records (δ = {fmt(s.get('delta'))})"
    if total is None:
        why = ((s.get("consortium") or {}).get("missing") or {}).get(name, "")
        return (
            f"<tr><th>{who}</th><td colspan='3'>left the job: what it spent is on its own "
            f"ledger, not known here{' (' + html.escape(str(why)) + ')' if why else ''}</td></tr>"
        )
    budget = s.get("epsilon_budget")
    terms = f"this job may spend ε {fmt(budget)} of each source" if budget is not None else "—"
    return (
        f"<tr><th>{who}</th><td class='n'>{fmt(job)}</td><td class='n'>{fmt(total)}</td>"
        f"<td>{terms}</td></tr>"
    )


_ARM_COLUMNS = (
    ("arm", "arm"),
    ("score", "score (label-free)"),
    ("counts", "agreement with the noisy counts"),
    ("largest_share", "largest class share"),
    ("collapsed", "collapsed"),
    ("accuracy", "accuracy"),
)


def choice_table(ch: dict[str, Any]) -> str:
    """The label-free choice among arms: the rule and the arm kept in a line, what the
    collapse guard said, then every arm in a row (folded under a summary: there are many)."""
    arms = [a for a in ch.get("arms") or [] if isinstance(a, dict)]
    vote = ch.get("vote")
    members: dict[str, Any] = {}
    if isinstance(vote, dict) and ch.get("rule") == "vote":
        names = list(map(str, vote.get("members") or []))
        weights = vote.get("weights") or [None] * len(names)
        members = dict(zip(names, weights, strict=False))
    head = (
        f"<p><b>rule</b> {html.escape(fmt(ch.get('rule') or ch.get('criterion')))} · "
        f"<b>criterion</b> {html.escape(fmt(ch.get('criterion')))} · <b>kept</b> "
        f"{html.escape(fmt(ch.get('kept')))} · <b>arms</b> {len(arms)}"
        + (
            f" · <b>accuracy of the kept arm</b> {html.escape(fmt(ch['kept_accuracy']))}"
            if ch.get("kept_accuracy") is not None
            else ""
        )
        + "</p>"
    )
    if ch.get("guard"):
        head += f"<p><b>collapse guard:</b> {html.escape(str(ch['guard']))}</p>"
    if ch.get("failed"):
        head += "<p><b>left out:</b> " + html.escape("; ".join(map(str, ch["failed"]))) + "</p>"
    if not arms:
        return f"<h2>Label-free choice</h2>{head}"

    def cell(a: dict[str, Any], k: str) -> str:
        v = (a.get("scores") or {}).get("counts") if k == "counts" else a.get(k)
        return html.escape(fmt(v))

    header = "".join(f"<th>{html.escape(n)}</th>" for _, n in _ARM_COLUMNS)
    rows = "".join(
        "<tr>"
        + "".join(f"<td class='n'>{cell(a, k)}</td>" for k, _ in _ARM_COLUMNS)
        + f"<td>{_arm_mark(a, ch, members)}</td></tr>"
        for a in arms
    )
    return (
        f"<h2>Label-free choice</h2>{head}<details><summary>every arm</summary>"
        f"<table class='choice'><tr>{header}<th></th></tr>{rows}</table></details>"
    )


def _arm_mark(a: dict[str, Any], ch: dict[str, Any], members: dict[str, Any]) -> str:
    """How an arm stands in the choice: kept, one of the vote's members (with its weight), or
    nothing."""
    if a.get("arm") == ch.get("kept"):
        return "kept"
    name = str(a.get("arm"))
    if name not in members:
        return ""
    w = members[name]
    return "votes" if w is None else f"votes (weight {html.escape(fmt(w))})"


def selection_table(sel: dict[str, Any]) -> str:
    """The model choice: how it chose, and each candidate (λe, λg) with its label-free score
    (and its accuracy where the target has labels) in a row, the chosen one marked."""
    head = f"<p><b>method</b> {html.escape(fmt(sel.get('method')))}"
    head += "".join(
        f" · <b>{k}</b> {html.escape(fmt(sel[k]))}" for k in ("reg_e", "reg_g", "score") if k in sel
    )
    head += "</p>"
    cands = [c for c in sel.get("candidates") or [] if isinstance(c, dict)]
    if not cands:
        return f"<h2>Selection</h2>{head}"
    cols = [k for k in ("reg_e", "reg_g", "score", "accuracy") if any(k in c for c in cands)]
    rows = "".join(
        "<tr>"
        + "".join(f"<td class='n'>{html.escape(fmt(c.get(k)))}</td>" for k in cols)
        + f"<td>{'chosen' if (c.get('reg_e'), c.get('reg_g')) == chosen else ''}</td></tr>"
        for chosen in [(sel.get("reg_e"), sel.get("reg_g"))]
        for c in cands
    )
    names = {"reg_e": "λe (reg_e)", "reg_g": "λg (reg_g)", "score": "score (label-free)"}
    header = "".join(f"<th>{html.escape(names.get(k, k))}</th>" for k in cols)
    return (
        f"<h2>Selection</h2>{head}<table class='selection'><tr>{header}<th></th></tr>{rows}</table>"
    )


def _block(name: str, values: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(_label(str(k)))}</th><td>{html.escape(fmt(v))}</td></tr>"
        for k, v in values.items()
    )
    return f"<h2>{html.escape(_label(name).capitalize())}</h2><table>{rows}</table>"


def _spend_chart(summary: dict[str, Any], figures: dict[str, Any]) -> str:
    """This job's ε after each of its releases, against this job's budget (not the dataset's
    total against it, which would read as a budget exceeded)."""
    ys = figures.get("job_spend") or figures["batch_spend"]
    at = figures.get("job_spend_at")
    budget = figures["budget"]
    return line_chart(
        list(ys),
        budget,
        "this job's ε after each release",
        cap_label=f"this job's budget ε {fmt(budget)}",
        xs_at=list(at) if at else None,
    )


def figures_of(
    res: Any, view: Any, budget: float, terms_release: str | None = None
) -> dict[str, Any]:
    """Arrays for the report from a ``DPDAResult`` and the target's ``TargetView``."""
    x = view.x - view.x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    axes = vt[:2].T
    mapped = res.mapped - view.x.mean(axis=0) if res.mapped.size else np.zeros((0, x.shape[1]))
    return {
        "batch_spend": list(res.batch_spend) or [res.epsilon_spent],
        "budget": budget,
        "noisy_counts": res.noisy_counts,
        "mapped_labels": np.asarray(res.mapped_labels, dtype=np.int64),
        "target_2d": x @ axes,
        "target_labels": view.labels if view.labels is not None else res.predictions,
        "predicted_counts": np.bincount(np.asarray(res.predictions, dtype=np.int64)).tolist()
        if np.asarray(res.predictions).size
        else None,
        "mapped_2d": mapped @ axes if mapped.size else np.zeros((0, 2)),
        **_synthetic_figure(res, terms_release),
    }


def _synthetic_figure(res: Any, release: str | None) -> dict[str, Any]:
    """sinkhorn-synthetic: the released points beside the target's rows, both in the session's
    projected space (where the points were trained), on the target rows' top two directions."""
    xt = getattr(res, "target_projected", np.zeros((0, 0)))
    pts = getattr(res, "source_points", np.zeros((0, 0)))
    if release != "sinkhorn-synthetic" or xt.size == 0 or pts.size == 0:
        return {}
    mean = xt.mean(axis=0)
    _, _, vt = np.linalg.svd(xt - mean, full_matrices=False)
    axes = vt[:2].T
    return {
        "target_projected_2d": (xt - mean) @ axes,
        "synthetic_2d": (pts - mean) @ axes,
        "synthetic_labels": np.asarray(res.source_point_labels, dtype=np.int64),
    }
