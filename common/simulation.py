"""The in-process pipeline (``dpda simulate``): source-only, non-private OTDA and DPDA on one
machine, no network. The DPDA arm runs the same job code as the service, against the in-process
``SourceReleaser`` behind a real (in-memory) ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from dpda.data.loaders import Domain
from dpda.dp.ledger import Budget, LedgerEntry, MemoryLedgerStore, PrivacyLedger, default_delta
from dpda.dp.rng import public_rng, secure_rng, testing_streams
from dpda.errors import ConfigError
from dpda.ot.costs import dpot_cost
from dpda.ot.mapping import barycentric_map
from dpda.ot.references import REFERENCE_MEMORY_MB, REFERENCE_ROWS, reference_method
from dpda.ot.solvers import sinkhorn_group_lasso, uniform
from dpda.policy import PrivacyPolicy
from dpda.source_party.features import prepare_features
from dpda.source_party.releases import SourceReleaser
from dpda.target_party.compute import Compute
from dpda.target_party.pipeline import DPDAResult, run_dpda
from dpda.target_party.training import accuracy, fit_predict
from dpda.target_party.view import AdaptConfig, RowQueries, TargetView, resolve_scaling, target_view
from dpda.terms import METHODS, PATE_SHARE, SessionTerms, method_terms


def source_in_target_scaling(source: Domain, view: TargetView, representation: str) -> np.ndarray:
    from dpda.data.preprocessing import per_row

    return view.scaling.apply(per_row(source.x, representation))


def _scored(pred: np.ndarray, view: TargetView) -> float | None:
    """Accuracy against the target's labels, when it has them (a real target has none)."""
    return accuracy(pred, view.labels) if view.labels is not None else None


def _subsample(n: int, cap: int, seed: int, stream: int) -> np.ndarray | None:
    """Sorted indices of a uniform subsample of ``cap`` of ``n`` rows; None: every row."""
    if cap <= 0 or n <= cap:
        return None
    rng = np.random.default_rng([seed, stream])
    return np.sort(rng.choice(n, cap, replace=False))


def _predict(x: np.ndarray, y: np.ndarray, xt: np.ndarray, cfg: AdaptConfig) -> np.ndarray:
    """``fit_predict`` with the distances of a nearest-neighbour classifier in row blocks."""
    import sklearn

    with sklearn.config_context(working_memory=REFERENCE_MEMORY_MB):
        return np.asarray(fit_predict(x, y, xt, cfg.classifier, cfg.seed)[1])


def source_only_predictions(
    source: Domain, view: TargetView, representation: str, cfg: AdaptConfig
) -> np.ndarray:
    xs = source_in_target_scaling(source, view, representation)
    return _predict(xs, source.labels(), view.x, cfg)


def otda_predictions(
    source: Domain,
    view: TargetView,
    representation: str,
    cfg: AdaptConfig,
    max_rows: int = REFERENCE_ROWS,
) -> np.ndarray:
    """Non-private entropic + group-lasso OTDA in the target's full space (reference only):
    the exact problem on at most ``max_rows`` rows a side (a uniform subsample, drawn from
    ``cfg.seed``; 0: every row), so its memory is bounded whatever the tables' sizes."""
    xs = source_in_target_scaling(source, view, representation)
    ys = source.labels()
    xt = view.x
    rs = _subsample(xs.shape[0], max_rows, cfg.seed, 31)
    rt = _subsample(xt.shape[0], max_rows, cfg.seed, 37)
    if rs is not None:
        xs, ys = xs[rs], ys[rs]
    if rt is not None:
        xt = xt[rt]
    cost = dpot_cost(xs, xt)
    res = sinkhorn_group_lasso(
        uniform(xs.shape[0]),
        uniform(xt.shape[0]),
        cost.normalized,
        ys,
        cfg.reg_e,
        cfg.reg_g,
        outer_iter=cfg.outer_iter,
        inner_iter=cfg.inner_iter,
    )
    x_hat = barycentric_map(res.plan, xt)
    del cost, res
    return _predict(x_hat, ys, view.x, cfg)


BASELINE_SCALINGS = ("zscore", "uniform")


def best_scaling_baselines(
    source: Domain,
    target: Domain,
    representation: str,
    cfg: AdaptConfig,
    max_rows: int = REFERENCE_ROWS,
) -> tuple[dict[str, np.ndarray], str, dict[str, dict[str, float | None]]]:
    """Non-private source-only and OTDA in their best form: each under every column scaling
    of ``BASELINE_SCALINGS``, the one with the higher source-only accuracy kept (picked with
    the target's labels when it has them: a reference for the tables, not a method; without
    labels, z-score). Returns (predictions by arm, the scaling kept, every accuracy).
    ``max_rows``: OTDA's subsample (``otda_predictions``)."""
    runs: dict[str, dict[str, np.ndarray]] = {}
    scores: dict[str, dict[str, float | None]] = {}
    for mode in BASELINE_SCALINGS:
        view = target_view(target, representation, scaling_mode=mode)
        logistic = replace(cfg, classifier="logistic")
        runs[mode] = {
            "source_only": source_only_predictions(source, view, representation, cfg),
            "source_only_logistic": source_only_predictions(source, view, representation, logistic),
            "otda": otda_predictions(source, view, representation, cfg, max_rows),
        }
        scores[mode] = {k: _scored(v, view) for k, v in runs[mode].items()}
    best = BASELINE_SCALINGS[0]
    if target.y is not None:
        best = max(BASELINE_SCALINGS, key=lambda m: scores[m]["source_only"] or 0.0)
    return runs[best], best, scores


def source_only(
    source: Domain, view: TargetView, representation: str, cfg: AdaptConfig
) -> float | None:
    return _scored(source_only_predictions(source, view, representation, cfg), view)


def otda(source: Domain, view: TargetView, representation: str, cfg: AdaptConfig) -> float | None:
    return _scored(otda_predictions(source, view, representation, cfg), view)


@dataclass(frozen=True)
class SimulationOutcome:
    source_only: float | None
    otda: float | None
    runs: dict[str, DPDAResult]
    ledgers: dict[str, list[LedgerEntry]] = field(default_factory=dict)  # per method, in-memory
    # the target's own disclosures under DP: ε they spend at its δ; None: exact
    target_epsilon_spent: float | None = None
    target_delta: float | None = None
    target_row_queries: str = "exact"  # what PATE sent about the target's rows
    baseline_scaling: str | None = None  # the scaling the non-private baselines ran under
    baseline_by_scaling: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # per method: the target's view the job ran on (``keep_views``: the estimator reads it)
    views: dict[str, TargetView] = field(default_factory=dict)
    # whether the non-private references ran and how (``reference_method``), or why not
    references: dict[str, Any] = field(default_factory=dict)
    # what the source's DP preprocessing estimated (its own record), or what it was not
    preprocessing: dict[str, Any] = field(default_factory=dict)
    source_only_logistic: float | None = None  # non-private, logistic, the baselines' scaling
    # several sources (``simulate_consortium``): each source's spend, the ones that opened and
    # the ones missing, and why (``Consortium.report``); None for a one-source job
    consortium: dict[str, Any] | None = None

    @property
    def dpda(self) -> DPDAResult:
        """The main run: DPDA if it ran, else the first method that did."""
        return self.runs.get("dpda") or next(iter(self.runs.values()))

    def to_json(self, terms: SessionTerms) -> dict[str, Any]:
        d = self.dpda
        acc: dict[str, float | None] = {"source_only": self.source_only, "otda": self.otda}
        if self.source_only_logistic is not None:
            acc["source_only_logistic"] = self.source_only_logistic
        for m, r in self.runs.items():
            acc[m.replace("+", "_")] = r.accuracy
        if "dpda" in d.accuracy_by_method:  # DPDA's own model, whichever arm the job keeps
            acc["dpda"] = d.accuracy_by_method["dpda"]
        if "dp_no_adaptation" in d.accuracy_by_method:
            acc["dp_no_adaptation"] = d.accuracy_by_method["dp_no_adaptation"]
        if d.adaptation.get("kept_accuracy") is not None:
            acc["kept"] = d.adaptation["kept_accuracy"]  # the model the job keeps
        elif d.accuracy is not None:
            acc["kept"] = d.accuracy
        choice = d.adaptation.get("choice")
        return {
            "baseline_scaling": self.baseline_scaling,
            "baseline_by_scaling": self.baseline_by_scaling,
            "references": self.references,
            **d.summary(terms),
            "accuracy": acc,
            "preprocessing": self.preprocessing,
            "choice": choice,
            "forecast": d.forecast,
            "epsilon_spent": max(r.epsilon_spent for r in self.runs.values()),
            "epsilon_by_method": {m: r.epsilon_spent for m, r in self.runs.items()},
            "epsilon_budget": terms.epsilon,
            "pate_queries": max(r.pate_queries for r in self.runs.values()),
            "target_disclosures": (
                "none"
                if self.target_epsilon_spent is None
                and d.terms is not None
                and d.terms.source_space
                else "dp"
                if self.target_epsilon_spent is not None
                else "exact"
            ),
            # 0.0: the target disclosed nothing (a source-space release); None: exact statistics
            "target_epsilon_spent": (
                0.0
                if self.target_epsilon_spent is None
                and d.terms is not None
                and d.terms.source_space
                else self.target_epsilon_spent
            ),
            "target_delta": self.target_delta,
            "target_row_queries": self.target_row_queries
            if any(r.pate_queries for r in self.runs.values())
            else None,
            **(
                {
                    "epsilon_spent_by_source": self.consortium["epsilon_spent_by_source"],
                    "consortium": self.consortium,
                }
                if self.consortium is not None
                else {}
            ),
        }


def _method_view(
    shared: TargetView | None, target: Domain, representation: str, asked: str, t: SessionTerms
) -> TargetView:
    """A method's view: the shared one, or a source-space release's own."""
    if not t.source_space:
        assert shared is not None  # the shared view is built for the methods in a shared basis
        return shared
    return _own_view(target, representation, asked, t)


def _own_view(target: Domain, representation: str, asked: str, t: SessionTerms) -> TargetView:
    return target_view(target, representation, scaling_mode=resolve_scaling(asked, t), terms=t)


def in_process_source(
    domain: Domain,
    terms: SessionTerms,
    representation: str,
    seed: int | None,
    attribute_bound: float = 1.0,
) -> tuple[SourceReleaser, MemoryLedgerStore, Callable[[], float]]:
    """A rehearsal's source: ``domain`` behind an in-memory ledger with the terms' budget, the
    rehearsal policy (``PrivacyPolicy.rehearsal``) and streams drawn from ``seed`` (None: fresh
    secure ones); returns the releaser, its ledger's store and what reads its spend."""
    rng, public = testing_streams(seed) if seed is not None else (secure_rng(), public_rng())
    store = MemoryLedgerStore()
    ledger = PrivacyLedger(store, {terms.dataset: Budget(terms.epsilon, terms.delta)})
    releaser = SourceReleaser(
        domain,
        terms.dataset,
        ledger,
        rng,
        representation,
        policy=PrivacyPolicy.rehearsal(terms.privacy_unit, terms.release, attribute_bound),
        public=public,
        insecure_seed=seed is not None,
    )
    return releaser, store, partial(ledger.spent, terms.dataset)


def simulate(
    source: Domain,
    target: Domain,
    terms: SessionTerms,
    representation: str,
    cfg: AdaptConfig,
    seed: int | None,
    baselines: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    scaling_mode: str = "auto",
    methods: tuple[str, ...] = ("dpda",),
    pate_queries: int = 100,
    pate_share: float = PATE_SHARE,
    attribute_bound: float = 1.0,
    target_epsilon: float | None = None,
    target_delta: float | None = None,
    target_row_clip: float | None = None,
    target_row_queries: str = "exact",
    target_query_epsilon: float = 4.0,
    compute: Compute | None = None,
    reference_rows: int = REFERENCE_ROWS,
    keep_views: bool = False,
) -> SimulationOutcome:
    """Each method runs as its own session on a fresh ledger at the same total ε.

    The in-process source runs the rehearsal policy (``PrivacyPolicy.rehearsal``): it allows the
    unit and release the user asked for, with every other rule of the default policy (replace-one,
    floors, bounds). A fixed ``seed`` is recorded in every ledger entry as an insecure seed.
    ``target_epsilon``: the target's scaling and basis are released under its own DP
    (``dpda.dp.target_disclosure``) at δ = ``target_delta`` (default 1/(10·nt)).
    ``target_row_queries``: what PATE sends about the target's rows (``RowQueries``); ``dp``
    (needs ``target_epsilon``) adds ``target_query_epsilon`` to the target's spend. The methods
    are alternatives, each its own session at the same ε: each PATE method draws its own noise on
    the same rows, and ``target_epsilon_spent`` is what one of them spends (as ``epsilon_spent``
    is for the source).
    ``compute``: where the per-batch fits run (``dpda.target_party.compute``; default here).
    ``baselines``: run the non-private references (source-only, OTDA); None (the default): only
    when the target has labels to score them. ``reference_rows``: OTDA's subsample a side
    (``otda_predictions``; 0: every row).

    Parameters
    ----------
    source : Domain
        The source's rows and labels (class indices); the in-process source holds them.
    target : Domain
        The target's rows; its labels, when it has them, only score the results.
    terms : SessionTerms
        The session terms; each method runs under its own at the same ε (``method_terms``).
    representation : str
        The per-row transform both parties apply first: ``raw``, ``sqrt``, ``rownorm`` or
        ``l2`` (as ``DPDAClassifier``'s).
    cfg : AdaptConfig
        How the target adapts (transport, classifier, the choices on its side).
    seed : int or None
        The seed of every draw, recorded in every ledger entry as an insecure seed; None:
        fresh secure randomness.
    baselines : bool or None, default None
        Run the non-private references (source-only, OTDA); None: only when ``target`` has
        labels.
    progress : callable or None, default None
        Called as ``progress(done, total)`` after each release of a session.
    scaling_mode : {'auto', 'zscore', 'uniform'}, default 'auto'
        The target's column scaling: ``auto`` is ``uniform`` for a source-space release and
        ``zscore`` otherwise.
    methods : tuple of str, default ('dpda',)
        The methods to run, each as its own session at the same ε: ``dpda``, ``pate``,
        ``dpda+pate``; another name is refused.
    pate_queries : int, default 100
        ``pate`` and ``dpda+pate``: the target rows the teachers label, in [1, 100000].
    pate_share : float, default 0.1
        ``dpda+pate``: PATE's share of ε, in (0, 1).
    attribute_bound : float, default 1.0
        The rehearsal policy's attribute bound (the attribute unit's protected change of one
        feature, in the per-row representation), in (0, 1e6].
    target_epsilon : float or None, default None
        ε of the target's own DP disclosures (its scaling and basis) for the methods in a
        shared basis, positive; None: its exact statistics are used.
    target_delta : float or None, default None
        δ of those disclosures, in (0, 1); None: 1/(10·nt) for the target's nt rows.
    target_row_clip : float or None, default None
        With ``target_epsilon``: the target rows' norm bound in the per-row representation,
        positive; None: 1 for ``sqrt``, ``l2`` and ``rownorm``, required for ``raw``.
    target_row_queries : {'exact', 'dp', 'synthetic'}, default 'exact'
        What PATE sends about the target's rows: ``exact``, the chosen rows, projected;
        ``dp``, rows drawn at random, clipped and noised (it takes ``target_epsilon``);
        ``synthetic``, points drawn from the target's statistics.
    target_query_epsilon : float, default 4.0
        ``target_row_queries='dp'``: ε of the row queries, added to the target's spend;
        positive.
    compute : Compute or None, default None
        Where the per-batch fits run; None: in this process.
    reference_rows : int, default 5000
        OTDA's subsample a side, at least 0; 0: every row.
    keep_views : bool, default False
        Keep each method's view of the target in the outcome's ``views``.

    Returns
    -------
    SimulationOutcome
        Each method's run (``runs``; ``dpda`` the main one) and in-memory ledger entries
        (``ledgers``), the references' accuracies in percent (None when they did not run or
        the target has no labels), the target's own spend and δ, and the preprocessing the
        source ran; ``to_json`` gives the report ``dpda simulate --json`` prints.
    """
    by_method = {
        m: method_terms(terms, m, pate_queries, pate_share) if methods != ("dpda",) else terms
        for m in methods
    }
    # a source-space release needs nothing of the target; the others need its statistics
    shared = [t for t in by_method.values() if not t.source_space]
    asked_scaling = scaling_mode
    # each method's own scaling (its view): ``auto`` differs between a source-space release and
    # one in a shared basis; the statistics disclosed are those of the shared ones
    scaling_mode = resolve_scaling(asked_scaling, shared[0] if shared else terms)
    privacy = None
    t_spent = None
    t_events: list = []
    if target_epsilon is not None and shared:
        from dpda.dp.target_disclosure import disclose, plan_disclosure

        t_delta = target_delta if target_delta is not None else default_delta(target.x.shape[0])
        plan = plan_disclosure(
            target_epsilon,
            t_delta,
            target.x.shape[1],
            representation,
            target_row_clip,
            with_basis=any(t.projection == "target-pca" for t in shared),
        )
        t_rng = np.random.default_rng([seed, 19]) if seed is not None else secure_rng()
        privacy = disclose(
            target.x, representation, scaling_mode, terms.projection_dim, plan, t_rng
        )
        t_events = plan.events()
        target_delta = t_delta
    rq = RowQueries(target_row_queries)
    pate = any(m != "dpda" for m in methods)
    if target_row_queries == "synthetic" and privacy is not None and privacy.variances.size:
        rq = RowQueries("synthetic", variances=privacy.variances)
    elif target_row_queries == "dp":
        from dpda.dp.target_disclosure import noisy_rows, plan_row_queries

        if privacy is None or target_delta is None:
            raise ConfigError("target_row_queries: dp needs target_epsilon (the DP clip norm)")
        qplan = plan_row_queries(target_query_epsilon, target_delta)
        q_rng = np.random.default_rng([seed, 23]) if seed is not None else secure_rng()
        rq = RowQueries("dp", protect=lambda _sid, rows, clip: noisy_rows(rows, clip, qplan, q_rng))
        t_events = t_events + (qplan.events() if pate else [])
    if privacy is not None:
        from dpda.dp.ledger import spend_of

        t_spent = spend_of(t_events, target_delta or 0.0)
    # the shared view, built only when a method reads it (a source-space release has its own:
    # at 10⁶ rows a view is a few hundred MB)
    view = (
        target_view(target, representation, scaling_mode=scaling_mode, disclosure=privacy)
        if shared
        else None
    )
    runs: dict[str, DPDAResult] = {}
    ledgers: dict[str, list[LedgerEntry]] = {}
    views: dict[str, TargetView] = {}
    pre_report: dict[str, Any] = {}
    for method, t in by_method.items():
        releaser, store, spent = in_process_source(
            source, t, representation, seed, attribute_bound=attribute_bound
        )
        # a source-space release: its own view (its scaling, the rows clipped to its C), held
        # only while its job runs. The job takes it from a list, as the target daemon's does:
        # a view the job replaces (its rows moved into the source's DP standardization) is
        # then freed in the job, not held here until it returns
        job_view = [_method_view(view, target, representation, asked_scaling, t)]
        if keep_views:
            views[method] = job_view[0]
        size = (source.x.shape[0], source.n_classes)  # what the source publishes
        runs[method] = run_dpda(
            releaser, job_view.pop(), t, cfg, spent, progress, rq, compute, size
        )
        ledgers[method] = store.entries(t.dataset)
        if method == "dpda" or not pre_report:
            reports = list(releaser.preprocessing_reports.values())
            pre_report = reports[0] if reports else {"mode": "none"}
    kept: str | None = None
    by_scaling: dict[str, dict[str, float | None]] = {}
    run_refs = target.y is not None if baselines is None else baselines
    references: dict[str, Any] = {"ran": run_refs}
    if run_refs:
        _, kept, by_scaling = best_scaling_baselines(
            source, target, representation, cfg, reference_rows
        )
        references["method"] = reference_method(
            source.x.shape[0], target.x.shape[0], reference_rows
        )
    else:
        references["why"] = (
            "skipped: the target has no labels to score them (asked for, they run)"
            if baselines is None
            else "not asked for"
        )
    so = by_scaling[kept]["source_only"] if kept else None
    ot_acc = by_scaling[kept]["otda"] if kept else None
    so_lr = by_scaling[kept]["source_only_logistic"] if kept else None
    return SimulationOutcome(
        so,
        ot_acc,
        runs,
        ledgers,
        t_spent,
        target_delta,
        rq.mode,
        kept,
        by_scaling,
        views=views,
        references=references,
        preprocessing=pre_report,
        source_only_logistic=so_lr,
    )


def simulate_consortium(
    sources: dict[str, Domain],
    target: Domain,
    terms: SessionTerms,
    representation: str,
    cfg: AdaptConfig,
    seed: int | None,
    baselines: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    scaling_mode: str = "auto",
    reference_rows: int = REFERENCE_ROWS,
) -> SimulationOutcome:
    """One target job over several sources (``dpda.target_party.consortium``), each an
    in-process source with a ledger, a budget and a noise stream of its own, under ``terms``.

    The non-private references pool the sources' rows (what a user with every source's data
    would run). ``to_json`` gains ``epsilon_spent_by_source`` and ``consortium``; its
    ``epsilon_spent`` is the largest of the sources' spends.

    Parameters
    ----------
    sources : dict of str to Domain
        Each source's rows and labels, by the name the report gives it; at least two.
    target, terms, representation, cfg, seed, baselines, progress, scaling_mode, reference_rows
        As for ``simulate``.

    Returns
    -------
    SimulationOutcome
        The job's run (``runs["dpda"]``), each source's ledger entries (``ledgers``, by
        source), the pooled references and ``consortium``.
    """
    from dpda.target_party.consortium import Consortium, check_consortium_terms

    check_consortium_terms(terms)
    releasers: dict[str, SourceReleaser] = {}
    stores: dict[str, MemoryLedgerStore] = {}
    spent: dict[str, Callable[[], float]] = {}
    for k, (name, domain) in enumerate(sources.items()):
        # each source its own noise streams, a pure function of the seed
        releasers[name], stores[name], spent[name] = in_process_source(
            domain, terms, representation, None if seed is None else seed * 1000 + k
        )
    consortium = Consortium(releasers, spent)
    job_view = [_own_view(target, representation, scaling_mode, terms)]  # (see ``simulate``)
    # the terms are the same at every source: cells follow the smallest one's rows
    smallest = min(sources.values(), key=lambda d: d.x.shape[0])
    size = (smallest.x.shape[0], smallest.n_classes)
    run = run_dpda(
        consortium, job_view.pop(), terms, cfg, consortium.spent, progress, source_rows=size
    )
    pooled = Domain(
        "+".join(sources),
        np.vstack([d.x for d in sources.values()]),
        np.concatenate([d.labels() for d in sources.values()]),
        max(d.n_classes for d in sources.values()),
    )
    run_refs = target.y is not None if baselines is None else baselines
    kept: str | None = None
    by_scaling: dict[str, dict[str, float | None]] = {}
    references: dict[str, Any] = {"ran": run_refs, "pooled": list(sources)}
    if run_refs:
        _, kept, by_scaling = best_scaling_baselines(
            pooled, target, representation, cfg, reference_rows
        )
        references["method"] = reference_method(
            pooled.x.shape[0], target.x.shape[0], reference_rows
        )
    return SimulationOutcome(
        by_scaling[kept]["source_only"] if kept else None,
        by_scaling[kept]["otda"] if kept else None,
        {"dpda": run},
        {name: st.entries(terms.dataset) for name, st in stores.items()},
        baseline_scaling=kept,
        baseline_by_scaling=by_scaling,
        references=references,
        preprocessing={"mode": "none"},
        source_only_logistic=by_scaling[kept]["source_only_logistic"] if kept else None,
        consortium=consortium.report(),
    )


PUBLIC_SOURCE_STEPS = 300  # noisy Frank–Wolfe steps


def simulate_public_source(
    source: Domain,
    target: Domain,
    representation: str,
    scaling_mode: str,
    epsilon: float,
    delta: float,
    seed: int | None,
    steps: int = PUBLIC_SOURCE_STEPS,
) -> dict[str, Any]:
    """The public-source setting in one process: the source's rows and labels are public,
    the target's rows private. Weights q on the source rows come from noisy Frank–Wolfe on the
    smooth discrepancy (the target's only contribution: the second moment of its clipped rows,
    read by ``dpda.dp.discrepancy``); a q-weighted logistic regression on the public rows makes
    the predictions. Everything else is public: the per-row transform, the source's column
    scaling, its top principal directions, the clip radius (the 90% quantile of the source's
    projected norms). Also reported: the source alone (uniform q) and the same minimisation
    without noise (exact Frank–Wolfe steps), for comparison only."""
    from sklearn.linear_model import LogisticRegression

    from dpda.data.preprocessing import PublicSpace, per_row
    from dpda.dp import discrepancy as D

    space = PublicSpace.of(source.x, representation, scaling_mode)
    xs = space.scaling.apply(per_row(source.x, representation))
    xt = space.scaling.apply(per_row(target.x, representation))
    ps = space.map(source.x)
    pt = D.holder_rows(target.x, space.map, 1.0)  # the holder clips its rows to radius 1
    moment = D.second_moment(pt)
    radius = float(np.max(np.linalg.norm(ps, axis=1)))
    sens = D.gradient_sensitivity(D.SMOOTHING, radius, 1.0, pt.shape[0])
    rng = np.random.default_rng(seed) if seed is not None else secure_rng()

    def weights(eps: float | None) -> D.PrivateWeights:
        return D.noisy_frank_wolfe(
            ps,
            moment,
            epsilon=eps,
            delta=delta,
            steps=steps,
            mu=D.SMOOTHING,
            ridge=D.RIDGE,
            sensitivity=sens,
            rng=rng,
        )

    def fit(q: np.ndarray) -> np.ndarray:
        clf = LogisticRegression(max_iter=500)
        clf.fit(xs, source.y, sample_weight=q * q.size)
        return np.asarray(clf.predict(xt))

    def score(pred: np.ndarray) -> float | None:
        return accuracy(pred, target.y) if target.y is not None else None

    uniform_q = np.full(xs.shape[0], 1.0 / xs.shape[0])
    private, exact = weights(epsilon), weights(None)
    pred = fit(private.q)
    return {
        "setting": "public-source",
        "accuracy": {
            "source_only": score(fit(uniform_q)),
            "dpda": score(pred),
            "non_private_reweighting": score(fit(exact.q)),
        },
        "discrepancy": {
            "source_only": D.discrepancy(uniform_q, ps, moment),
            "dpda": D.discrepancy(private.q, ps, moment),
            "non_private_reweighting": D.discrepancy(exact.q, ps, moment),
        },
        "epsilon_spent": private.epsilon,
        "epsilon_budget": epsilon,
        "delta": delta,
        "privacy_unit": "record",
        "protected": "the target's rows (the source is public)",
        "steps": steps,
        "predictions_array": pred,
    }


__all__ = [
    "simulate",
    "simulate_public_source",
    "SimulationOutcome",
    "prepare_features",
    "method_terms",
    "METHODS",
]
