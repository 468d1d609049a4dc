"""dpda: differentially private domain adaptation across a privacy boundary.

The public API is small: ``DPDAClassifier`` (both parties in one process, as a scikit-learn
estimator; ``DPDASkadaEstimator`` is the same inside a skada pipeline), ``read_table`` (your own
CSV / Parquet / .npy / .npz / DataFrame), ``load_model`` (a job's saved model pipeline),
``SessionTerms`` (what a session asks of the source), ``simulate`` (the rehearsal, with
baselines), ``AdaptConfig`` (the target's transport and classifier settings) and
``__version__``. The daemons run from the ``dpda`` command; everything else is internal, laid
out by layer (see docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpda.version import __version__

if TYPE_CHECKING:  # what readers, type checkers and editors follow (go to definition)
    from dpda.data.tables import read_table
    from dpda.estimator import DPDAClassifier
    from dpda.simulation import simulate
    from dpda.skada_adapter import DPDASkadaEstimator
    from dpda.target_party.training import load_model
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

_PUBLIC = {
    "DPDAClassifier": "dpda.estimator",
    "DPDASkadaEstimator": "dpda.skada_adapter",
    "read_table": "dpda.data.tables",
    "load_model": "dpda.target_party.training",
    "SessionTerms": "dpda.terms",
    "simulate": "dpda.simulation",
    "AdaptConfig": "dpda.target_party.view",
}
__all__ = [
    "AdaptConfig",
    "DPDAClassifier",
    "DPDASkadaEstimator",
    "SessionTerms",
    "__version__",
    "load_model",
    "read_table",
    "simulate",
]


def __getattr__(name: str) -> Any:  # at run time, imported on first use: `import dpda` stays fast
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dpda' has no attribute {name!r}")
