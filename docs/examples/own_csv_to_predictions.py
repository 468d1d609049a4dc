"""Your own CSV files to predictions, both parties in one process.

Reads the source's labeled table and the target's unlabeled one, fits ``dpda.DPDAClassifier``
(the same job code and the same charge as a real two-party job, against an in-memory ledger)
and writes the target's predictions keyed by its row ids.

    python own_csv_to_predictions.py S.csv T.csv predictions.csv [--epsilon 6] [--demo]

``--demo`` first writes ``S.csv`` and ``T.csv`` from the synthetic two-domain problem (a header,
a ``row_id`` column, and ``label`` in the source's).
"""

from __future__ import annotations

import argparse
import csv

import numpy as np

import dpda
from dpda.data.synthetic import two_domains


def write_demo_tables(source_csv: str, target_csv: str, k: int = 10) -> None:
    source, target = two_domains(n_source=300, n_target=200, k=k, seed=0)
    names = [f"f{j}" for j in range(k)]
    with open(source_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row_id", *names, "label"])
        for i, (row, label) in enumerate(zip(source.x, source.y, strict=True)):
            w.writerow([f"s{i}", *np.round(row, 6), int(label)])
    with open(target_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row_id", *names])
        for i, row in enumerate(target.x):
            w.writerow([f"t{i}", *np.round(row, 6)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source_csv", nargs="?", default="S.csv")
    p.add_argument("target_csv", nargs="?", default="T.csv")
    p.add_argument("predictions_csv", nargs="?", default="predictions.csv")
    p.add_argument("--epsilon", type=float, default=6.0)
    p.add_argument("--demo", action="store_true", help="write the synthetic tables first")
    args = p.parse_args()
    if args.demo:
        write_demo_tables(args.source_csv, args.target_csv)

    src = dpda.read_table(args.source_csv, "label", id_column="row_id")
    tgt = dpda.read_table(args.target_csv, "label", labels="optional", id_column="row_id")
    clf = dpda.DPDAClassifier(epsilon=args.epsilon, projection_dim=5, random_state=0)
    clf.fit(src.x, src.y, tgt.x)
    predictions = clf.predict(tgt.x)

    with open(args.predictions_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "prediction"])
        w.writerows(zip(tgt.ids, predictions, strict=True))
    print(
        f"ε spent {clf.epsilon_spent_:.3f} of {args.epsilon}; "
        f"{len(predictions)} predictions in {args.predictions_csv}"
    )


if __name__ == "__main__":
    main()
