"""``dpda.DPDAClassifier`` as a scikit-learn estimator: in a ``Pipeline``, cloned, re-parameterised.

The estimator stores its parameters verbatim, so ``clone``, ``get_params``/``set_params`` and
pipelines work as for any scikit-learn classifier. The target's rows go to ``fit`` as ``Xt``
(routed to the pipeline's step as ``dpda__Xt``); a step before it would transform ``X`` but not
``Xt``, so per-row preprocessing belongs in the estimator (``representation``) or in skada's
pipeline (skada_pipeline.py). Here: accuracy on the target against ε, on the synthetic problem.

    python sklearn_pipeline.py [--epsilons 1 4 8]
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.base import clone
from sklearn.pipeline import Pipeline

import dpda
from dpda.data.synthetic import two_domains


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    args = p.parse_args()
    source, target = two_domains(n_source=300, n_target=200, k=10, seed=0)

    pipe = Pipeline([("dpda", dpda.DPDAClassifier(projection_dim=5, random_state=0))])
    for epsilon in args.epsilons:
        model = clone(pipe).set_params(dpda__epsilon=epsilon)
        model.fit(source.x, source.y, dpda__Xt=target.x)
        accuracy = float(np.mean(model.predict(target.x) == target.y))
        spent = model.named_steps["dpda"].epsilon_spent_
        print(f"ε budget {epsilon:4g}  spent {spent:.3f}  accuracy on the target {accuracy:.3f}")


if __name__ == "__main__":
    main()
