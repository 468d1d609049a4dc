"""``dpda bench label-leak``: what the attribute unit gives away, measured on real features.

The adversary of DESIGN.md §2a knows only one record's own features (and what is public: the
target's scaling and basis, which it may well be). It projects the record, takes the nearest
noisy row of the label-sorted attribute-unit release, and reads the record's label off that row's
block (the noisy counts delimit the blocks). For every source record in turn; the accuracy is
compared with the largest class's share (the best guess without the release). Under the default
policy (record unit, class aggregates) there is no per-row release to match against.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from dpda.dp.ledger import default_delta
from dpda.dp.mechanisms import PrivacyUnit
from dpda.service.output import add_json_option, write_json
from tests.bench.harness import add_data_dir, add_pairs


def label_leak(data_dir: str, src: str, tgt: str, epsilon: float, seed: int) -> dict[str, Any]:
    from dpda.data.loaders import load_domain
    from dpda.data.preprocessing import DEFAULT_REPRESENTATION, DEFAULT_SCALING
    from dpda.data.preprocessing import default_attribute_bound as bound_rule
    from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger
    from dpda.dp.mechanisms import counts_to_labels
    from dpda.ot.costs import sq_euclidean
    from dpda.policy import PrivacyPolicy
    from dpda.protocol import TargetDisclosure
    from dpda.source_party.releases import SourceReleaser
    from dpda.target_party.view import target_pca_basis, target_view
    from dpda.terms import SessionTerms
    from tests.bench.accuracy import dataset_of

    ds = dataset_of(src)
    rep = DEFAULT_REPRESENTATION[ds]
    s, t = load_domain(data_dir, ds, src), load_domain(data_dir, ds, tgt)
    view = target_view(t, rep, scaling_mode=DEFAULT_SCALING[ds])
    ns, k = s.x.shape
    terms = SessionTerms(
        dataset=src, epsilon=epsilon, delta=default_delta(ns), privacy_unit=PrivacyUnit.ATTRIBUTE
    )
    ledger = PrivacyLedger(MemoryLedgerStore(), {src: Budget(epsilon, terms.delta)})
    policy = PrivacyPolicy.rehearsal("attribute", "rows", bound_rule(rep, k))
    rel = SourceReleaser(s, src, ledger, np.random.default_rng(seed), rep, policy=policy)
    basis = target_pca_basis(view.x, terms.projection_dim)
    info = rel.open_session(terms, TargetDisclosure(view.scaling, basis))
    batch = rel.release(info.session_id, 0)
    block = counts_to_labels(batch.noisy_counts, batch.z.shape[0])
    # the adversary's own computation: the record's features, the public scaling and basis
    own = view.scaling.apply(_per_row(s.x, rep)) @ info.projection
    guess = block[np.argmin(sq_euclidean(own, batch.z), axis=1)]
    return {
        "pair": f"{src}→{tgt}",
        "epsilon": epsilon,
        "epsilon_spent": ledger.spent(src),
        "seed": seed,
        "label_accuracy": float(100 * np.mean(guess == s.labels())),
        "largest_class": float(100 * np.bincount(s.labels()).max() / ns),
    }


def _per_row(x: np.ndarray, rep: str) -> np.ndarray:
    from dpda.data.preprocessing import per_row

    return per_row(x, rep)


def run_label_leak(args: argparse.Namespace) -> int:
    from dpda.data.loaders import require_data_dir
    from tests.bench.harness import parse_pairs

    data_dir = require_data_dir(args.data_dir)
    rows = []
    for s, t in parse_pairs(args.pairs):
        for eps in args.epsilons:
            r = label_leak(str(data_dir), s, t, eps, args.seed)
            rows.append(r)
            print(
                f"{r['pair']}  ε = {eps:g} (spent {r['epsilon_spent']:.3f}): label read off the "
                f"nearest noisy row {r['label_accuracy']:.1f}% (largest class "
                f"{r['largest_class']:.1f}%)"
            )
    write_json(args, {"runs": rows})
    return 0


def register_privacy(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "label-leak",
        help="attribute unit: how often a record's label is read off the nearest noisy row",
    )
    add_data_dir(s)
    add_pairs(s, ["C:A"])
    s.add_argument(
        "--epsilons", nargs="+", type=float, default=[8.0, 2.0], help="the ε values (default 8 2)"
    )
    s.add_argument("--seed", type=int, default=0, help="fixes the noise (default 0)")
    add_json_option(s)
    s.set_defaults(func=run_label_leak)
