"""``dpda demo``: the zero-setup main job on generated data."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_demo(args: argparse.Namespace) -> int:
    from common.data.synthetic import two_domains
    from common.terms import SessionTerms
    from target_party.pipeline import AdaptConfig
    from target_party.simulate import simulate

    from .progress import Progress

    src, tgt = two_domains()
    terms = SessionTerms(
        dataset="synthetic",
        epsilon=args.epsilon,
        delta=1.0 / (1.2 * src.x.shape[0]),
        projection="target-pca",
        projection_dim=10,
    )
    out = simulate(src, tgt, terms, "raw", AdaptConfig(), seed=None, progress=Progress("releases"))
    data = out.to_json(terms)
    data.update({"mode": "in-process", "ledger_verified": True, "audit_verified": None})
    a = data["accuracy"]
    print(
        "dpda demo — synthetic two-domain problem (600 source rows, 500 target rows, 40 features)"
    )
    print(
        f"  target accuracy: source-only {a['source_only']:.1f}%  non-private OTDA "
        f"{a['otda']:.1f}%  DPDA {a['dpda']:.1f}%"
    )
    print(
        f"  ε spent {data['epsilon_spent']:.3f} of {terms.epsilon} at δ={terms.delta:.3g} "
        f"({terms.privacy_unit} unit, {terms.neighbouring})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2))
    return 0
