"""dpda: differentially private domain adaptation across a privacy boundary.

The public API is small: ``SessionTerms`` (what a session asks of the source), ``simulate`` (both
parties in one process, for experiments), ``AdaptConfig`` (the target's transport and classifier
settings) and ``__version__``. The daemons run from the ``dpda`` command; everything else is
internal, laid out by layer (see the README's layout section).
"""

from __future__ import annotations

import importlib
from typing import Any

from dpda.version import __version__

_PUBLIC = {
    "SessionTerms": "dpda.terms",
    "simulate": "dpda.simulation",
    "AdaptConfig": "dpda.target_party.pipeline",
}
__all__ = ["AdaptConfig", "SessionTerms", "__version__", "simulate"]


def __getattr__(name: str) -> Any:  # imported on first use: `import dpda` stays fast
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dpda' has no attribute {name!r}")
