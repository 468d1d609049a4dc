"""The job report: one self-contained HTML page with inline SVG plots, axes with round ticks.

Drawn here rather than with matplotlib on purpose: the report is built on daemon hosts, which do
not install the ``bench`` extra (matplotlib draws only the benchmarks' PNG figures).

Figures: ε spent across the releases; noisy class counts next to the labels the target used;
a 2-D view (the target's top two principal directions) of target rows and mapped source rows;
for sinkhorn-synthetic, the released synthetic points beside the target's rows in the projected
space; accuracy when the target has labels.
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


def _tick_label(v: float) -> str:
    return f"{v:.3g}"


def _xticks(parts: list[str], lo: float, hi: float, x0: float, x1: float) -> None:
    for v in nice_ticks(lo, hi):
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


def line_chart(ys: list[float], cap: float, title: str) -> str:
    parts = _axes(title, "release", "ε spent")
    n = len(ys)
    top = max([cap, *ys]) * 1.05 if ys else 1.0
    xs = _scale(np.arange(1, n + 1, dtype=float), 0.0, max(n, 1), PAD, W - 20)
    yv = _scale(np.asarray(ys, dtype=float), 0.0, top, H - PAD, 30)
    cap_y = float(_scale(np.array([cap]), 0.0, top, H - PAD, 30)[0])
    parts.append(
        f'<line x1="{PAD}" y1="{cap_y:.1f}" x2="{W - 10}" y2="{cap_y:.1f}" '
        'stroke="#d62728" stroke-dasharray="4 3"/>'
    )
    parts.append(
        f'<text x="{W - 12}" y="{cap_y - 4:.1f}" text-anchor="end" font-size="11" '
        f'fill="#d62728">budget {cap:g}</text>'
    )
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, yv, strict=True))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for x, y, v in zip(xs, yv, ys, strict=True):
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#1f77b4">'
            f"<title>{v:.4f}</title></circle>"
        )
    _xticks(parts, 0.0, float(max(n, 1)), PAD, W - 20)
    _yticks(parts, 0.0, top, H - PAD, 30)
    return "".join(parts) + "</svg>"


def bar_chart(noisy: list[int], used: list[int], title: str) -> str:
    parts = _axes(title, "class", "rows")
    q = len(noisy)
    top = max([1, *noisy, *used]) * 1.1
    bw = (W - PAD - 20) / max(q, 1) / 2.5
    for c in range(q):
        x0 = PAD + 8 + c * (W - PAD - 20) / max(q, 1)
        for k, (v, color) in enumerate(((noisy[c], "#ff7f0e"), (used[c], "#1f77b4"))):
            h = max(0.0, v) / top * (H - PAD - 30)
            parts.append(
                f'<rect x="{x0 + k * bw:.1f}" y="{H - PAD - h:.1f}" width="{bw:.1f}" '
                f'height="{h:.1f}" fill="{color}"><title>{v}</title></rect>'
            )
        parts.append(
            f'<text x="{x0 + bw:.1f}" y="{H - PAD + 14}" text-anchor="middle" '
            f'font-size="10">{c}</text>'
        )
    parts.append(
        '<rect x="60" y="28" width="10" height="10" fill="#ff7f0e"/>'
        '<text x="74" y="37" font-size="11">noisy count</text>'
        '<rect x="160" y="28" width="10" height="10" fill="#1f77b4"/>'
        '<text x="174" y="37" font-size="11">rows labelled</text>'
    )
    _yticks(parts, 0.0, top, H - PAD, 30)
    return "".join(parts) + "</svg>"


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
    _xticks(parts, float(lo[0]), float(hi[0]), PAD + 6, W - 16)
    _yticks(parts, float(lo[1]), float(hi[1]), H - PAD - 6, 30)
    return "".join(parts) + "</svg>"


def render(summary: dict[str, Any], figures: dict[str, Any]) -> str:
    """The report page. ``figures`` holds the arrays; ``summary`` the numbers of results.json."""
    acc = summary.get("accuracy")
    acc_txt = "not measured (no target labels)" if acc is None else f"{acc:.2f}%"
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in summary.items()
        if k not in {"predictions_sha256"}
    )
    svgs = [line_chart(figures["batch_spend"], figures["budget"], "ε spent after each release")]
    if figures.get("noisy_counts"):
        noisy = np.sum(np.array(figures["noisy_counts"]), axis=0).tolist()
        used = np.bincount(figures["mapped_labels"], minlength=len(noisy)).tolist()
        svgs.append(bar_chart(noisy, used[: len(noisy)], "noisy class counts vs rows labelled"))
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
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>dpda job report</title>"
        "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}"
        "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:4px 8px;"
        "text-align:left;font-size:13px}svg{margin:8px;border:1px solid #eee}</style></head>"
        f"<body><h1>dpda job report</h1><p><b>Accuracy on the target:</b> {acc_txt}. "
        f"<b>ε spent:</b> the source {summary.get('epsilon_spent', 0):.4f} on its records at δ = "
        f"{summary.get('delta', 0):.3g}; {_target_spend(summary)}.</p>"
        f"<p><i>{html.escape(str(summary.get('caveat', '')))}</i></p>"
        f"<div>{''.join(svgs)}</div><h2>Figures</h2><table>{rows}</table></body></html>"
    )


def _target_spend(summary: dict[str, Any]) -> str:
    """The target's side of the session's privacy (issue 19), in words."""
    t = summary.get("target_epsilon_spent")
    if t is None:
        return "the target disclosed its statistics exactly (its opt-in: not protected)"
    total = summary.get("target_epsilon_total")
    tail = f" ({total:.4f} over every job on its rows)" if total is not None else ""
    return f"the target {t:.4f} on its own rows{tail}"


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
