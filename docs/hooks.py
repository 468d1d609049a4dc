"""MkDocs hooks: the benchmark outputs in tests/bench/results/ served as bench-results/, and
the examples' sources and the changelog included without copying them into docs/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "bench" / "results"


def on_files(files: Files, config) -> Files:
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in {".json", ".png", ".txt"}:
            files.append(
                File.generated(config, f"bench-results/{path.name}", abs_src_path=str(path))
            )
    files.append(
        File.generated(config, "changelog.md", content=(ROOT / "CHANGELOG.md").read_text())
    )
    return files
