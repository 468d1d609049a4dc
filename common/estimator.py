"""``dpda.DPDAClassifier``: both parties in one process, as a scikit-learn estimator.

For rehearsal and research: ``fit(Xs, ys, Xt)`` runs the same job code as ``dpda target run``
against an in-process source that holds ``(Xs, ys)`` behind an in-memory ledger under the
rehearsal policy (the unit and release asked for, every other rule of the default policy). The
real deployment keeps the source's rows on the source's machine; this estimator does not, so it
protects nothing by itself — it tells what a job would charge and how well it would do.

Parameters are stored verbatim (``clone``, ``get_params`` and grid search work); every
derived value is computed in ``fit``. Their defaults are the session terms' (``term_default``)
and the target job's (``TargetJob``, ``adapt_default``), read from those declarations.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from dpda.data.loaders import Domain
from dpda.data.preprocessing import check_representation, default_attribute_bound
from dpda.data.tables import Table
from dpda.dp.ledger import check_delta, default_delta
from dpda.policy import TargetPrivacyPolicy
from dpda.service.config import TERMS_OF_JOB, TargetJob, terms_of
from dpda.simulation import simulate
from dpda.target_party.training import model_pipeline
from dpda.target_party.view import ADAPT_KNOBS, adapt_default, resolve_scaling
from dpda.terms import DEFAULT_EPSILON, term_default

# how the job's rows are prepared and which channels it runs: the [job] fields that are neither
# session terms nor adaptation knobs
JOB_PARAMS = ("representation", "scaling", "method", "pate_queries", "pate_share")


def _job_default(name: str) -> Any:
    return TargetJob.model_fields[name].default


def _params() -> dict[str, Any]:
    """Every parameter and its default, read from the declarations: the session terms a job
    sets (``TERMS_OF_JOB``; ``SessionTerms``' defaults), the [job] table's own fields
    (``JOB_PARAMS``, ``TargetJob``), the adaptation knobs (``ADAPT_KNOBS``, ``AdaptConfig``),
    the target's own DP disclosures (``dpda simulate``'s ``--target-*``; ``TargetPrivacyPolicy``)
    and the rehearsal's own (the attribute bound of its policy, the seed)."""
    out: dict[str, Any] = {"epsilon": DEFAULT_EPSILON, "delta": None}
    for name in TERMS_OF_JOB:
        if name not in out and name != "dataset":
            out[name] = term_default(name)
    out.update({name: _job_default(name) for name in JOB_PARAMS})
    out.update({name: adapt_default(name) for name in ADAPT_KNOBS})
    own = TargetPrivacyPolicy.model_fields
    out.update(
        target_epsilon=None,  # None: the target's statistics are used exact (in process)
        target_row_clip=None,
        target_row_queries=None,  # synthetic with target_epsilon, else exact
        target_query_epsilon=own["query_epsilon"].default,
        attribute_bound=None,
        random_state=None,
    )
    return out


PARAMS = _params()


def _column_names(X: Any) -> list[str] | None:
    """The feature names of a table or a frame; None for an array (or a headerless table)."""
    if isinstance(X, Table):
        return list(X.columns) if X.named else None
    cols = getattr(X, "columns", None)
    if cols is None or isinstance(X, np.ndarray):
        return None
    return [str(c) for c in cols]


def _in_order(X: Any, names: list[str] | None, what: str) -> Any:
    """``X`` with its columns in the order of ``names`` (the source's at ``fit``), matched by
    name; a name that differs is refused naming the columns. Arrays pass as they are."""
    given = _column_names(X)
    if isinstance(X, Table):
        X_array: Any = X.x
    else:
        X_array = X
    if names is None or given is None:
        return X_array
    if given == names:
        return X_array
    missing = [c for c in names if c not in given]
    extra = [c for c in given if c not in names]
    if missing or extra or len(set(given)) != len(given):
        parts = [f"lacks {', '.join(map(repr, missing))}"] if missing else []
        parts += [f"has {', '.join(map(repr, extra))}, which fit's X has not"] if extra else []
        raise ValueError(
            f"The feature names should match those that were passed during fit: {what} "
            + ("; ".join(parts) or "repeats a column name")
        )
    if isinstance(X, Table):
        return X.x[:, [given.index(c) for c in names]]
    return X[names]  # a frame, reordered: the names still travel with it


class DPDAClassifier(ClassifierMixin, BaseEstimator):
    """Differentially private domain adaptation from a labeled source to an unlabeled target.

    ``fit(X, y, Xt=None, groups=None)``: ``X, y`` the source's rows and labels (any label
    values), ``Xt`` the target's unlabeled rows (default ``X`` itself: scikit-learn's own checks
    call ``fit(X, y)``). ``groups`` (one name per row of ``X``, two or more names) makes the fit
    one job over several sources, each group a source with its own ledger and the same terms
    (``dpda simulate --source-file S1 --source-file S2``). ``predict(X)`` applies the fitted
    pipeline (per-row transform, the target's scaling, the classifier trained on the mapped
    source rows) to raw rows. Frames and
    ``dpda.read_table`` tables are matched by column name: ``Xt`` and every later ``X`` are put
    in the order of ``fit``'s ``X``, and refused, naming the columns, when the names differ.

    The parameters are the job's, each by the name and with the default its declaration gives
    (``PARAMS``: the session terms, the [job] table, the adaptation knobs, the target's own DP
    disclosures as ``dpda simulate``'s ``--target-*`` flags), plus ``attribute_bound`` and
    ``random_state`` (``dpda simulate --seed``): the same files, ε and seed give ``dpda
    simulate``'s predictions.

    Every parameter is keyword-only and stored as given; ``fit`` validates them (a session
    term outside its range is refused, naming it).

    Parameters
    ----------
    epsilon : float, default 8.0
        ε, the session's budget on the source's ledger, in (0, 100].
    delta : float or None, default None
        δ of the source's records, in (0, 1/n) for the n rows of ``X``. None: 1/(10·n).
    privacy_unit : {'record', 'attribute'}, default 'record'
        What the releases protect: ``record``, a whole record (features and label);
        ``attribute``, one feature of one record moving by at most ``attribute_bound``, and
        neither labels nor membership (it takes ``release='rows'``).
    neighbouring : {'replace-one', 'add-remove'}, default 'replace-one'
        The neighbouring relation. The source accounts every release under ``replace-one``
        (it discloses exact sizes) and refuses ``add-remove``.
    projection : str or None, default None
        The space the release is computed in: ``source``, the source's own per-row space (the
        target maps it onto its own basis; nothing of the target is sent); ``target-pca``, the
        target's principal directions (its basis and scaling go to the source); ``jl``, a
        random projection the source draws. None: ``source`` for ``prototypes`` and
        ``class-gaussians`` with the ``sqeuclidean`` cost and no PATE, ``target-pca``
        otherwise.
    projection_dim : int or None, default None
        ℓ, the dimension of the OT space, in [1, 4096]; with ``source`` and ``target-pca``,
        lowered to the target's number of features or rows where it is larger. None: 20 with
        ``projection='source'``, 50 otherwise.
    batch_size : int, default 0
        Rows per minibatch release, in [0, 100000]; 0: one whole-dataset release. Minibatches
        take ``release='rows'``.
    steps : int, default 0
        Minibatch releases, in [0, 100000]; 0: as many as ε allows, at most ``max_steps``. A
        number the budget does not allow is refused.
    noise_multiplier : float, default 1.1
        σ/w, the minibatches' Gaussian noise per unit of sensitivity, in [0, 1e6] and at least
        the policy's floor 0.1; 0: the smallest σ that spends ε over ``steps`` batches (it
        takes ``batch_size > 0`` and ``steps > 0``).
    histogram_noise_ratio : float, default 2.0
        σ_h/σ, the noise of each minibatch's class histogram relative to that of its rows, in
        (0, 1e6].
    max_steps : int, default 64
        The most minibatch releases with ``steps=0``, in [1, 100000].
    histogram_share : float or None, default None
        The share of ε that sets the noisy class counts, in (0, 1). None: 0.1 for
        ``prototypes``, ``class-gaussians`` and ``sinkhorn-synthetic``, 0.5 otherwise.
    calibration : str or None, default None
        How σ follows from ε: ``theorem2`` (the DPDA paper's formula), ``analytic`` (the
        analytic Gaussian mechanism of Balle & Wang 2018) or ``exact`` (the smallest σ whose
        whole-dataset release the ledger charges at most ε). None: ``exact`` for
        ``prototypes`` and ``class-gaussians``, ``analytic`` for ``sinkhorn-synthetic``,
        ``theorem2`` otherwise.
    clip_norm : float, default 1.0
        C, the L2 norm each source row is clipped to before it is released, in (0, 1e12]
        (under the record unit, the policy's [1e-6, 1e6]). The target sets it where it can:
        1 for norm-1 representations and standardized rows in the source's space; under the
        record unit with ``projection='target-pca'``, the 0.9 quantile of its projected rows'
        norms (with ``target_epsilon``: their DP root mean square).
    cells : int or None, default None
        Prototypes: one noisy sum and count per (class, cell), each class's rows split into
        this many cells by random directions drawn independently of the data, in [1, 16];
        the same charge as one point per class. None: for raw rows the source standardizes,
        the most cells (at most 3) whose means the release's noise leaves precise enough at
        the source's rows per class; 1 otherwise.
    release : str or None, default None
        What the source releases: ``prototypes`` (noisy per-class sums and counts),
        ``class-gaussians`` (per-class sums, sums of squares and counts),
        ``sinkhorn-synthetic`` (labeled synthetic points trained on a DP Sinkhorn loss) or
        ``rows`` (noisy projected rows, under the attribute unit only). None: ``prototypes``
        under the record unit, ``rows`` under the attribute unit.
    synthetic_points : int, default 10
        ``sinkhorn-synthetic``: at most this many points per class, in [1, 100].
    synthetic_rows_per_point : int, default 70
        ``sinkhorn-synthetic``: one point per this many (noisy) rows of a class, in
        [1, 1000000].
    sinkhorn_steps : int, default 3
        ``sinkhorn-synthetic``: the noisy gradient steps T, in [1, 1000].
    sinkhorn_reg : float, default 0.05
        ``sinkhorn-synthetic``: the entropic λ, in units of cost/C², in [0.001, 100].
    sinkhorn_debias : float, default 0.4
        ``sinkhorn-synthetic``: the debiasing ratio p, in [0, 1].
    sinkhorn_learning_rate : float, default 0.5
        ``sinkhorn-synthetic``: the step size η, in (0, 1].
    cost : {'sqeuclidean', 'metric'}, default 'sqeuclidean'
        The OT ground cost: ``sqeuclidean`` in the projected space, or ``metric``, a metric W
        the source learns under DP from its labels and releases as one more release of the
        session (it takes ``batch_size=0`` and a ``method`` with the DPDA releases).
    metric_share : float, default 0.25
        ``metric``: its share of the Gaussian releases' privacy loss (μ², i.e. zCDP ρ), in
        [0.01, 0.99].
    metric_dim : int, default 0
        ``metric``: the rows d′ of W, in [0, 4096] and at most ``projection_dim``; 0:
        ``projection_dim``.
    metric_pairs : int, default 4
        ``metric``: the public cap m on pairs per record, in [1, 64].
    metric_margin : float, default 1.0
        ``metric``: the contrastive margin, in units of C, in [0.001, 10].
    metric_clip : float, default 0.5
        ``metric``: the per-pair gradient clip G (Frobenius norm), in [0.001, 1000].
    metric_steps : int, default 20
        ``metric``: the noisy steps T, in [1, 1000].
    metric_learning_rate : float, default 0.5
        ``metric``: the step size η, in [0.0001, 100].
    pate_teachers : int, default 50
        PATE: the teachers the source trains, each on its own disjoint part of its records, in
        [1, 10000].
    pate_aggregator : {'gnmax', 'lnmax'}, default 'gnmax'
        PATE: the noisy arg-max of the teachers' votes, with Gaussian (``gnmax``) or Laplace
        (``lnmax``) noise.
    pate_space : {'projected', 'raw'}, default 'projected'
        PATE: the space the queries are sent in. ``raw`` (target rows as they are) is an
        opt-in the in-process source does not give: a PATE ``method`` with it is refused.
    representation : {'raw', 'sqrt', 'rownorm', 'l2'}, default 'raw'
        The per-row transform both parties apply first: ``raw``, the rows as they are;
        ``sqrt``, the square root of each row's share of its sum (non-negative features only);
        ``rownorm``, each row divided by its sum; ``l2``, each row divided by its L2 norm.
    scaling : {'auto', 'zscore', 'uniform'}, default 'auto'
        The column scaling of the OT space, from the target's rows: ``zscore``, each column
        by its own standard deviation; ``uniform``, every column by one scale; ``auto``,
        ``uniform`` for a source-space release and ``zscore`` otherwise.
    method : {'dpda', 'pate', 'dpda+pate'}, default 'dpda'
        The release channels: ``dpda``, the DPDA releases alone; ``pate``, PATE teacher
        answers alone, at all of ε; ``dpda+pate``, both, PATE at ``pate_share`` of ε.
    pate_queries : int, default 100
        ``pate`` and ``dpda+pate``: the target rows the teachers label, in [1, 100000].
    pate_share : float, default 0.1
        ``dpda+pate``: PATE's share of ε, in (0, 1).
    reg_e : float, default 0.02
        The transport's entropic regularization, on the max-normalized cost; positive.
    reg_g : float, default 0.5
        The transport's group-lasso (class) regularization; non-negative.
    classifier : str, default '1nn'
        The model the job trains: on the adapted class points (or mapped source rows),
        ``1nn``, ``logistic`` or ``mlp``; on the target's own rows labeled by the transport,
        ``target-logistic`` (weighted by each row's confidence), ``target-knn`` (a vote of
        each row's 10 nearest rows) or ``target-spread`` (label spreading from the most
        confident half of the rows).
    select : {'circular', 'none'}, default 'circular'
        How (``reg_e``, ``reg_g``) are chosen on the received releases, without target labels
        (post-processing, no budget): ``circular`` scores a grid of pairs by how well the
        target's pseudo-labels predict the source's noisy points back; ``none`` keeps
        ``reg_e`` and ``reg_g``.
    transport_step : float, default 0.5
        Aggregate releases: how far each class point moves from itself toward its barycentric
        image under the plan, in [0, 1] (1: the image).
    refine : float, default 0.5
        Aggregate releases: how far each class point then moves toward the mean of the target
        rows it labels, in [0, 1] (0: not at all).
    keep : {'better', 'dpda'}, default 'better'
        The model kept: ``dpda``, the adapted one; ``better``, whichever of it and the same
        release used without adaptation the label-free estimate scores higher.
    target_epsilon : float or None, default None
        ε of the target's own DP disclosures (its column scaling and basis, for a release in a
        shared basis) at δ = 1/(10·m) for its m rows; positive. None: its exact statistics are
        used. A source-space release discloses nothing of the target either way.
    target_row_clip : float or None, default None
        With ``target_epsilon``: the target rows' norm bound in the per-row representation,
        positive. None: 1 for ``sqrt``, ``l2`` and ``rownorm``; ``raw`` rows need one.
    target_row_queries : str or None, default None
        PATE: what is sent about the target's rows: ``exact``, the chosen rows, projected and
        unprotected; ``dp``, rows drawn at random, clipped and noised at
        ``target_query_epsilon`` (it takes ``target_epsilon``); ``synthetic``, points drawn
        from the target's DP statistics, whose labels train a student that labels its rows.
        None: ``synthetic`` with ``target_epsilon``, ``exact`` without.
    target_query_epsilon : float, default 4.0
        ``target_row_queries='dp'``: ε of the row queries, added to the target's spend;
        positive.
    attribute_bound : float or None, default None
        The attribute unit: the change of one feature of one record it protects, in the
        per-row representation, in (0, 1e6]. None: 1/√k for ``sqrt``, ``l2`` and ``rownorm``
        rows of k features, 1 for ``raw``.
    random_state : int or None, default None
        The seed of every draw: the same data, parameters and seed give the same fit (as
        ``dpda simulate --seed``), and every ledger entry records it as an insecure seed.
        None: fresh secure randomness for every noise draw.

    Attributes
    ----------
    classes_ : numpy.ndarray
        The class labels of ``y``, sorted.
    n_features_in_ : int
        The number of features of ``X``.
    columns_ : list of str or None
        The feature names of ``fit``'s ``X`` (a frame or a named table); None for an array.
    epsilon_spent_ : float
        This fit's charge on the source's ledger (several sources: the largest source's).
    epsilon_spent_by_source_ : dict of str to float or None
        With ``groups``: each source's charge; None for a one-source fit.
    target_epsilon_spent_ : float or None
        The target's own spend, with ``target_epsilon``; 0.0 when the release disclosed
        nothing of the target; None when its exact statistics were used.
    ledger_ : list of dict, or dict of str to list of dict
        The source's ledger entries of this fit, as JSON dicts (with ``groups``: by source).
    mapped_ : numpy.ndarray
        The source's noisy rows mapped into the target's space.
    mapped_labels_ : numpy.ndarray
        Their labels, as values of ``classes_``.
    sigma_ : float
        σ/w, the release's noise multiplier.
    model_ : sklearn.pipeline.Pipeline
        The fitted pipeline ``predict`` applies to raw rows.
    target_predictions_ : numpy.ndarray
        The predictions for the target's rows (``Xt``, else ``X``).
    """

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise TypeError(f"DPDAClassifier: unknown parameter(s) {', '.join(unknown)}")
        for name, default in PARAMS.items():
            setattr(self, name, params.get(name, default))

    # scikit-learn reads the parameters off the signature: one keyword per declared parameter
    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
            for name, default in PARAMS.items()
        ]
    )

    def __getattr__(self, name: str) -> Any:  # typed access to the declared parameters
        raise AttributeError(name)

    def fit(self, X: Any, y: Any, Xt: Any = None, groups: Any = None) -> DPDAClassifier:
        names = _column_names(X)
        X = _in_order(X, names, "X")
        if Xt is not None:
            Xt = _in_order(Xt, names, "Xt")
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_min_samples=2)
        self.columns_ = names
        check_classification_targets(y)
        self.classes_, y_enc = np.unique(y, return_inverse=True)
        xt = X if Xt is None else validate_data(self, Xt, dtype=np.float64, reset=False)
        rep = self.representation
        check_representation(X, rep, "representation")
        check_representation(xt, rep, "representation")
        n = X.shape[0]
        g = None if groups is None else self._groups(groups, n)
        if g is not None:  # the sources share the terms: δ for the largest of them
            n = int(np.unique(g, return_counts=True)[1].max())
        delta = self.delta if self.delta is not None else default_delta(n)
        check_delta(delta, n, "delta", "the source (X)")
        terms = terms_of(_Settings(self, dataset="source", delta=delta))
        seed = self.random_state
        from dpda.target_party.view import adapt_config

        cfg = adapt_config(self, seed if seed is not None else 0)
        source = Domain("source", X, y_enc.astype(np.int64), len(self.classes_))
        target = Domain("target", xt, None, 0)
        bound = self.attribute_bound
        if bound is None:
            bound = default_attribute_bound(rep, X.shape[1])
        scaling = resolve_scaling(self.scaling, terms)
        if g is not None:
            return self._fit_sources(source, target, g, terms, cfg, scaling)
        out = simulate(
            source,
            target,
            terms,
            rep,
            cfg,
            seed,
            baselines=False,
            scaling_mode=scaling,
            methods=(self.method,),
            pate_queries=self.pate_queries,
            pate_share=self.pate_share,
            attribute_bound=bound
            if bound is not None
            else default_attribute_bound(rep, X.shape[1]),
            target_epsilon=self.target_epsilon,
            target_row_clip=self.target_row_clip,
            target_row_queries=self.target_row_queries
            or ("synthetic" if self.target_epsilon is not None else "exact"),
            target_query_epsilon=self.target_query_epsilon,
            keep_views=True,
        )
        res = out.dpda
        self.epsilon_spent_ = res.epsilon_spent
        self.epsilon_spent_by_source_ = None
        self.target_epsilon_spent_ = out.to_json(terms)["target_epsilon_spent"]
        self.ledger_: Any = [json.loads(e.to_json()) for e in out.ledgers[self.method]]
        return self._keep(res, res.view if res.view is not None else out.views[self.method])

    def _fit_sources(
        self,
        source: Domain,
        target: Domain,
        g: np.ndarray,
        terms: Any,
        cfg: Any,
        scaling: str,
    ) -> DPDAClassifier:
        """``fit`` over several sources: ``g`` names each row's source (``_groups``)."""
        from dpda.simulation import simulate_consortium

        names = [str(v) for v in np.unique(g)]  # sorted: the sources' order is the names'
        y = source.labels()
        domains = {k: Domain(k, source.x[g == k], y[g == k], source.n_classes) for k in names}
        out = simulate_consortium(
            domains, target, terms, self.representation, cfg, self.random_state,
            baselines=False, scaling_mode=scaling,
        )  # fmt: skip
        res = out.dpda
        data = out.to_json(terms)
        self.epsilon_spent_ = res.epsilon_spent
        self.epsilon_spent_by_source_ = data["epsilon_spent_by_source"]
        self.target_epsilon_spent_ = data["target_epsilon_spent"]
        self.ledger_ = {n: [json.loads(e.to_json()) for e in out.ledgers[n]] for n in names}
        assert res.view is not None  # a finished job's result carries it
        return self._keep(res, res.view)

    def _groups(self, groups: Any, n: int) -> np.ndarray:
        """``groups`` as one source name a row of X, checked before anything runs."""
        from dpda.errors import ConfigError

        g = np.asarray(groups).astype(str)
        if g.shape != (n,):
            raise ConfigError(f"groups: {g.size} names for the {n} rows of X (one name a row)")
        if self.method != "dpda" or self.target_epsilon is not None:
            raise ConfigError("groups: several sources run method 'dpda' without target_epsilon")
        if np.unique(g).size < 2:
            raise ConfigError("groups: one name only; several sources need two or more")
        return g

    def _keep(self, res: Any, fitted: Any) -> DPDAClassifier:
        """The fitted attributes every fit sets from its run: σ, the mapped rows, the
        predictions and the pipeline on raw rows (in the view the model was fitted in)."""
        self.sigma_ = res.noise_multiplier
        self.mapped_ = res.mapped
        self.mapped_labels_ = self.classes_[res.mapped_labels]
        self.target_predictions_ = self.classes_[res.predictions]
        self.model_ = model_pipeline(
            self.representation,
            fitted.scaling,
            res.model,
            fitted.clip_norm,
            fitted.standardization,
        )
        return self

    def _rows(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        X = _in_order(X, self.columns_, "X")
        return validate_data(self, X, dtype=np.float64, reset=False)

    def predict(self, X: Any) -> np.ndarray:
        rows = self._rows(X)  # not fitted: NotFittedError first
        return self.classes_[self.model_.predict(rows)]

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, len(classes_)): the classifier's class probabilities (0 or 1 for ``1nn``); a
        class no mapped source row carried has probability 0."""
        X = self._rows(X)
        proba = np.asarray(self.model_.predict_proba(X))
        out = np.zeros((X.shape[0], len(self.classes_)))
        out[:, np.asarray(self.model_.classes_, dtype=np.int64)] = proba
        return out

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy (a fraction) on ``X`` (matched by column name, as ``predict``) against ``y``."""
        from sklearn.metrics import accuracy_score

        return float(accuracy_score(y, self.predict(X), sample_weight=sample_weight))


class _Settings:
    """The estimator's parameters read by name (``terms_of``), with ``changes``."""

    def __init__(self, est: DPDAClassifier, **changes: Any) -> None:
        self._est, self._changes = est, changes

    def __getattr__(self, name: str) -> Any:
        if name in self._changes:
            return self._changes[name]
        return getattr(self._est, name)


__all__ = ["DPDAClassifier"]
