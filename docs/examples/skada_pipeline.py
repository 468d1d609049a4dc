"""``dpda.DPDASkadaEstimator`` inside skada's ``make_da_pipeline``.

skada passes source and target rows together, told apart by ``sample_domain`` (positive:
source, negative: target), with the target's labels masked; every step of the pipeline sees
both domains, so a scaler before the estimator is fitted on both. Needs the ``skada`` extra.

    python skada_pipeline.py [--epsilon 8]
"""

from __future__ import annotations

import argparse

import numpy as np
from skada import make_da_pipeline
from sklearn.preprocessing import StandardScaler

import dpda
from dpda.data.synthetic import two_domains


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, default=8.0)
    args = p.parse_args()
    source, target = two_domains(n_source=300, n_target=200, k=10, seed=0)

    X = np.vstack([source.x, target.x])
    y = np.concatenate([source.y, np.full(len(target.y), -1)])  # the target's labels masked
    sample_domain = np.concatenate([np.ones(len(source.y)), -np.ones(len(target.y))]).astype(int)

    pipe = make_da_pipeline(
        StandardScaler(),
        dpda.DPDASkadaEstimator(epsilon=args.epsilon, projection_dim=5, random_state=0),
    )
    pipe.fit(X, y, sample_domain=sample_domain)
    predictions = pipe.predict(target.x, sample_domain=-np.ones(len(target.y), dtype=int))
    print(f"accuracy on the target {np.mean(predictions == target.y):.3f} at ε = {args.epsilon:g}")


if __name__ == "__main__":
    main()
