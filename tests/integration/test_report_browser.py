"""The job report and the API's pages as a reader sees them, in a real headless Chromium: a real
job's ``report.html`` and a ten-class report, their screenshots' structure checked — one framed
plot per figure, the budget line in the ε plot, every class's swatch and label inside the
scatter — and ``/docs`` of a running daemon rendered with no network beyond it.

Skipped where Chromium is not installed; in CI (``CI=true``, where .ci/run installs it) that
fails instead. The screenshots are kept in ``$DPDA_SCREENSHOT_DIR`` (else the test's folder);
the test prints their paths."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dpda.deployment import SourceProcess, run_target
from dpda.target_party.report import PAD, PALETTE, H, W, legend_swatch, render

from .helpers import need, start_target_serve, synthetic_deployment

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


def _kept(tmp_path: Path, name: str) -> Path:
    """Where a screenshot goes: ``$DPDA_SCREENSHOT_DIR/name`` when set, else the test's folder."""
    where = os.environ.get("DPDA_SCREENSHOT_DIR")
    folder = Path(where).resolve() if where else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _swatch_centre(x_axis: int, y_axis: int, i: int) -> tuple[int, int]:
    """The screen pixel at the middle of the ``i``-th legend swatch of the scatter whose x axis
    starts at (``x_axis``, ``y_axis``) on screen."""
    sx, sy = legend_swatch(i)
    return x_axis - PAD + sx + 5, y_axis - (H - PAD) + sy + 5


def _has_colour(img: np.ndarray, hex_colour: str, box: tuple[int, int, int, int]) -> bool:
    want = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    y0, y1, x0, x1 = box
    part = img[y0:y1, x0:x1, :3].astype(int)
    return bool(np.any(np.abs(part - want).max(axis=2) <= 12))


def test_a_real_jobs_report_renders_with_its_plots_and_legends(tmp_path: Path) -> None:
    need(BROWSER, "chromium is not installed (apt-get install chromium)")
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
    png = _kept(tmp_path, "report.png")
    _shoot(page, png)
    print(f"report screenshot: {png}")
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
    # over the points at the plot's top left
    y_last, x_last = max(axes)
    for c in range(5):
        x, y = _swatch_centre(x_last, y_last, c)
        assert _has_colour(img, PALETTE[c], (y - 2, y + 3, x - 2, x + 3)), c
    # the headline above the plots: the job's own facts, in ink
    assert img[:120].min() < 60
    assert results["job_id"] in text and f"job</b> {results['job_id']}" in text
    # the source's budget cell: the dataset's cap beside what this job may spend
    cap = results["epsilon_dataset_cap"]
    assert cap is not None and f"cap ε {cap:g} over every job" in text


def _ten_class_report() -> tuple[dict, dict]:
    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(10), 30)
    centres = rng.normal(0, 6, (10, 2))
    pts = centres[labels] + rng.normal(0, 1, (300, 2))
    summary = {
        "job_id": "tenclasses01",
        "dataset": "digits",
        "accuracy": 81.5,
        "epsilon_job": 2.0,
        "epsilon_spent": 6.0,
        "epsilon_dataset_total": 6.0,
        "epsilon_budget": 2.0,
        "epsilon_dataset_cap": 8.0,
        "delta": 1e-4,
        "selection": {
            "method": "circular",
            "reg_e": 0.02,
            "reg_g": 0.5,
            "score": 0.71,
            "candidates": [
                {"reg_e": e, "reg_g": g, "score": 0.5 + 0.1 * i}
                for i, (e, g) in enumerate([(0.01, 0.1), (0.02, 0.5), (0.05, 1.0)])
            ],
        },
    }
    figures = {
        "batch_spend": [1.0, 2.0],
        "budget": 2.0,
        "target_2d": pts,
        "target_labels": labels,
        "mapped_2d": pts[::3] + 0.5,
        "mapped_labels": labels[::3],
    }
    return summary, figures


def test_a_ten_class_report_shows_every_class_the_budgets_and_the_selection_table(
    tmp_path: Path,
) -> None:
    """Every class's swatch and label inside the scatter (none cut at its right edge), the
    dataset's cap in the source's budget cell, the running total named as such, and the model
    choice as a table of its candidates."""
    need(BROWSER, "chromium is not installed (apt-get install chromium)")
    image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot")
    summary, figures = _ten_class_report()
    text = render(summary, figures)
    page = tmp_path / "ten.html"
    page.write_text(text, encoding="utf-8")
    png = _kept(tmp_path, "report-ten-classes.png")
    _shoot(page, png)
    print(f"ten-class report screenshot: {png}")
    img = np.asarray(image.open(png).convert("RGB"))
    axes = axes_in(img)
    assert len(axes) == text.count("<svg") == 2, axes
    y_last, x_last = max(axes)
    left = x_last - PAD  # the scatter's own left edge on screen
    for c in range(10):
        sx, _ = legend_swatch(c)
        assert sx + 13 + 40 <= W - 4, c  # swatch and "class c" inside the plot's width
        x, y = _swatch_centre(x_last, y_last, c)
        assert _has_colour(img, PALETTE[c], (y - 2, y + 3, x - 2, x + 3)), c
        # its label in ink, right of the swatch
        label = img[y - 5 : y + 5, x + 8 : x + 40, :3]
        assert label.max(axis=2).min() < 120, c
        assert x + 40 < left + W
    assert "cap ε 8 over every job; this job may spend ε 2" in text
    assert "running total" in text and "ε this job" in text
    table = text[text.index("<table class='selection'>") :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + 3 and table.count("chosen") == 1


def test_the_docs_page_renders_offline_from_the_daemons_own_assets(tmp_path: Path) -> None:
    """``/docs`` of a running ``dpda target serve``, in Chromium with no proxy and no network
    beyond loopback: Swagger UI's script runs (it is the daemon's copy) and lists the jobs API
    read from ``/openapi.json`` — all without the token, which the page's Authorize button
    takes for the calls it makes."""
    need(BROWSER, "chromium is not installed (apt-get install chromium)")
    dep = synthetic_deployment(tmp_path)
    src = SourceProcess(dep)
    tgt, port = start_target_serve(dep, tmp_path / "target.log")
    try:
        dom = _dom(f"http://127.0.0.1:{port}/docs", tmp_path / "chrome")
        redoc = _dom(f"http://127.0.0.1:{port}/redoc", tmp_path / "chrome-redoc")
        png = _kept(tmp_path, "docs.png")
        _shoot_url(f"http://127.0.0.1:{port}/docs", png)
        print(f"/docs screenshot: {png}")
    finally:
        tgt.terminate()
        tgt.wait(timeout=20)
        src.stop()
    assert "dpda admin API" in dom and 'class="swagger-ui' in dom
    assert "/v1/jobs/{job_id}/report" in dom  # read from /openapi.json and drawn by the script
    assert "authorize" in dom.lower()
    # ReDoc drew the operations read from the schema, not only its own title
    words = " ".join(
        re.sub(r"<[^>]+>", " ", re.sub(r"<style.*?</style>", "", redoc, flags=re.S)).split()
    )
    assert "Download OpenAPI specification" in words and "get /v1/jobs/{job_id}/report" in words


def _dom(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran, with every request beyond loopback failing."""
    assert BROWSER is not None
    return subprocess.run(
        [
            BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=127.0.0.1",
            f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--dump-dom", url,
        ],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "HOME": str(profile.parent)},
    ).stdout  # fmt: skip


def _shoot_url(url: str, png: Path) -> None:
    assert BROWSER is not None
    subprocess.run(
        [
            BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=127.0.0.1",
            "--hide-scrollbars", "--virtual-time-budget=15000",
            f"--user-data-dir={png.parent / 'chrome-docs'}", f"--screenshot={png}",
            "--window-size=1200,1400", url,
        ],
        capture_output=True, timeout=120, check=True, env={**os.environ, "HOME": str(png.parent)},
    )  # fmt: skip
