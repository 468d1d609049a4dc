"""The job report as a reader sees it: a real job's ``report.html``, rendered by a real headless
Chromium, and the screenshot's structure checked — one framed plot per figure, the budget line
in the ε plot, a colour per class in the legend — not only the HTML text.

Skipped where Chromium is not installed (CI machines need not have it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dpda.deployment import SourceProcess, run_target
from dpda.target_party.report import PAD, PALETTE, H

from .helpers import synthetic_deployment

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 1200, 1800
AXIS_MIN = 400  # px: a chart's x axis is one dark line ~466 px long; no text is


def _shoot(page: Path, png: Path) -> None:
    assert BROWSER is not None
    subprocess.run(
        [
            BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", "--force-device-scale-factor=1",
            f"--user-data-dir={png.parent / 'chrome'}", f"--screenshot={png}",
            f"--window-size={WIDTH},{HEIGHT}", f"file://{page}",
        ],
        capture_output=True, timeout=120, check=True, env={**os.environ, "HOME": str(png.parent)},
    )  # fmt: skip


def axes_in(img: np.ndarray) -> list[tuple[int, int]]:
    """(row, first column) of every long dark horizontal line: the charts' x axes."""
    dark = img[:, :, :3].max(axis=2) < 160  # black, anti-aliased over two rows: grey
    found: list[tuple[int, int]] = []
    for y in range(dark.shape[0]):
        row = np.concatenate([[0], dark[y].astype(np.int8), [0]])
        edges = np.flatnonzero(np.diff(row))
        for x0, x1 in zip(edges[::2], edges[1::2], strict=True):
            near = any(abs(y - fy) <= 3 and abs(x0 - fx) <= 5 for fy, fx in found)
            if x1 - x0 >= AXIS_MIN and not near:
                found.append((y, int(x0)))
    return found


def _has_colour(img: np.ndarray, hex_colour: str, box: tuple[int, int, int, int]) -> bool:
    want = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    y0, y1, x0, x1 = box
    part = img[y0:y1, x0:x1, :3].astype(int)
    return bool(np.any(np.abs(part - want).max(axis=2) <= 12))


@pytest.mark.skipif(BROWSER is None, reason="chromium is not installed (apt-get install chromium)")
def test_a_real_jobs_report_renders_with_its_plots_and_legends(tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot")
    dep = synthetic_deployment(tmp_path, job={"batch_size": 120, "steps": 4}, attribute_unit=True)
    src = SourceProcess(dep)
    try:
        done = run_target(dep, "--json", str(tmp_path / "job.json"))
    finally:
        src.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "job.json").read_text())
    page = Path(results["output_dir"]) / "report.html"
    text = page.read_text()
    png = tmp_path / "report.png"
    _shoot(page, png)
    img = np.asarray(image.open(png).convert("RGB"))
    assert img.shape[:2] == (HEIGHT, WIDTH)

    axes = axes_in(img)
    assert len(axes) == text.count("<svg"), axes  # every plot drawn, each with its x axis
    # the first plot is this job's ε: its dashed budget line (red) sits inside it
    y_axis, x_axis = min(axes)
    first = (y_axis - 280, y_axis, x_axis, x_axis + 480)
    assert _has_colour(img, "#d62728", first)
    assert _has_colour(img, "#1f77b4", first)  # and the ε curve
    # the scatter's legend: a swatch per class in the plot's colours (5 classes here), drawn
    # over the points at the plot's top left (svg: x 60 + 54·c … +10, y 43 … 53; axis y 256)
    y_last, x_last = max(axes)
    for c in range(5):
        x, y = x_last - PAD + 60 + 54 * c + 5, y_last - (H - PAD) + 48
        assert _has_colour(img, PALETTE[c], (y - 2, y + 3, x - 2, x + 3)), c
    # the headline above the plots: the job's own facts, in ink
    assert img[:120].min() < 60
    assert results["job_id"] in text and f"job</b> {results['job_id']}" in text
    (tmp_path / "report-path.txt").write_text(str(png))
