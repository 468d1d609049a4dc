"""``dpda bench accuracy --protocol consortium-replay``: how a consortium job might weigh its
voters and choose among its sources, measured on the job's own arms
(docs/results.md#consortium-replay).

Each job is the bench's own (``consortium_cell``: Office-Caltech's leave-one-domain-out tasks;
``several_cell``: the development suite's several-source families), run with the label-free
choice's arms recorded. Beside the job's arms, each source's release alone is recorded as
arms of its own: adapted by its own fit and not adapted, with every classifier of
``choice.ARM_CLASSIFIERS``, in every space the job's arms use, scored as the job scores its
own. The job never sees them: its choice, its vote and what it keeps are the same as without
the recording. The vote is then replayed on the recorded labels under each variant of
``VARIANTS``, with the job's own gate and order (``choice.voters``, the job's own arms first,
as ``choice._vote`` puts them), and scored against the target's labels (a rehearsal's; never
read by any variant's choice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any
from unittest import mock

import numpy as np

from tests.bench.accuracy import mean_of
from tests.bench.consortium import DOMAINS

# how the job's own voters weigh across OT spaces of dimension ℓ, by row label of the table:
# the factor each applies to a voter's weight without the ℓ factor
# (``choice.vote_weights(..., pooled=False)``), given its ℓ and the largest ℓ among the voters;
# the first row is the job's own vote, whatever its rule (``choice.POOLED_DIM_WEIGHT``)
JOB = "the job's vote, replayed"
BY_DIM: dict[str, Callable[[int, int], float]] = {
    "equal weights across ℓ": lambda d, top: 1.0,
    "× log(1 + ℓ)": lambda d, top: float(np.log1p(d)),
    "× ℓ": lambda d, top: float(d),
    "× √ℓ": lambda d, top: float(np.sqrt(d)),
    "× ℓ²": lambda d, top: float(d * d),
    "the largest ℓ's voters alone": lambda d, top: float(d == top),
    "the voters of ℓ ≥ 20 alone": lambda d, top: float(d >= 20),
}
# what each variant adds to the job's vote, or how it chooses among the sources
AMONG = (
    "each source alone, adapted and not, as arms of their own",
    "the same, each source's arms at weight 1/3",
    "the arms without adaptation at weight 3",
) + tuple(f"the all-source or one source's vote, by {c}" for c in ("silhouette", "entropy",
          "snd", "consistency", "counts"))  # fmt: skip
VARIANTS = (JOB, *BY_DIM, *AMONG)


def _one_source_arms(s: Any, done: Any, mode: str, dim: int, job: Any) -> list[Any]:
    """Each source's release alone as arms of one (scaling, ℓ): adapted by its own fit and
    without adaptation, each with every classifier of ``ARM_CLASSIFIERS`` (``Arm.pooled``
    ``one<k>a`` / ``one<k>n``, k the source's place in the job)."""
    from dpda.target_party import choice as ch
    from dpda.target_party.fitting import Fitted, row_confidence

    fits = s.fit_all(done.releases, s.view)
    arms = []
    for k, f in enumerate(fits):
        one = Fitted(releases=[done.releases[k]], fits=[f], aggregate=done.aggregate)
        one.train(s.view, replace(s.cfg, classifier="1nn"))
        assert one.pred is not None
        bases: list[ch.Base] = [
            (True, f"one{k}a", one.model, one.pred, row_confidence(f.class_mass, one.pred)),
            (False, f"one{k}n", *ch._no_adaptation(s, [f]), None),
        ]
        arms += ch.arms_of_bases(s, bases, mode, dim, job)
    return arms


def _recorded(run: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``run()``'s result and its last choice's arms: names, labels of the target's rows,
    JSON rows, the noisy counts' shares, the target's labels, the job's own arm, its vote rule
    and the rows the criteria read. The job's vote sees its own arms only."""
    from dpda.target_party import choice as ch

    seen: dict[str, Any] = {}
    extra: list[Any] = []  # each source alone: recorded, never shown to the job
    arms_of, vote_of = ch._arms_of, ch._vote

    def arms(s: Any, done: Any, mode: str, dim: int, job: Any, pooled: bool = False) -> list:
        out = arms_of(s, done, mode, dim, job, pooled)
        if pooled:
            extra.extend(_one_source_arms(s, done, mode, dim, job))
        return out

    def vote(arms: list, rows: list, own: tuple, count_share: np.ndarray, s: Any, how: Any,
             pooled: bool = False) -> Any:  # fmt: skip
        scored = ch.ScoreRows.of(s.xt_proj, s.cfg.seed)
        for a in extra:  # scored as ``choose`` scores the job's arms
            a.scores = ch.scores_of(s.xt_proj, a.pred, count_share, s.cfg.seed, scored)
            share, top, a.collapsed = ch.class_shares(a.pred, count_share)
            a.largest_share = float(share[top])
        every = arms + extra
        seen.update(
            names=[a.name for a in every], preds=[a.pred for a in every],
            rows=rows + [a.to_json(ch.CRITERION) for a in extra], count_share=count_share,
            labels=s.view.labels, own=own, how=how, x=s.xt_proj, seed=s.cfg.seed,
            pooled=pooled, dim_weight=ch.POOLED_DIM_WEIGHT,
        )  # fmt: skip
        return vote_of(arms, rows, own, count_share, s, how, pooled)

    with mock.patch.object(ch, "_arms_of", arms), mock.patch.object(ch, "_vote", vote):
        result = run()
    return result, seen


def _group(name: str) -> str:
    """The arm's group: ``all`` (the job's own arms) or ``one<k>`` (source k alone)."""
    head = name.split("/")[0]
    return head[len("dpda_pooled_") : -1] if head.startswith("dpda_pooled_one") else "all"


def replay(rec: dict[str, Any]) -> dict[str, float | None]:
    """Each variant of ``VARIANTS``'s accuracy (%) on the recorded arms ``rec``; None for a
    variant that leaves no voter. The job's weights are the recorded job's
    (``choice.POOLED_DIM_WEIGHT`` as it ran)."""
    from dpda.target_party import choice as ch

    with mock.patch.object(ch, "POOLED_DIM_WEIGHT", rec["dim_weight"]):
        return _replayed(rec)


def _replayed(rec: dict[str, Any]) -> dict[str, float | None]:
    from dpda.target_party import choice as ch
    from dpda.target_party.training import vote

    names, rows, how, y = rec["names"], rec["rows"], rec["how"], rec["labels"]
    q = rec["count_share"].size
    own = tuple(rec["own"])
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        groups.setdefault(_group(n), []).append(i)

    def vote_over(
        idx: list[int], scale: Callable[[int], float] | None = None, by_dim: bool = True
    ) -> np.ndarray | None:
        """The vote over the arms ``idx`` as the job's would be: its voters, its own arms
        first (``choice._vote``), its weights (``by_dim`` False: without the ℓ factor), each
        times ``scale`` of the arm's index (voters at 0 left out)."""
        sub = [rows[i] for i in idx]
        members = ch.voters(sub, how.gate, rec["pooled"])
        if scale is not None:
            members = [m for m in members if scale(idx[m]) > 0]
        if not members:
            return None
        # the job's own arms first, among the job's (``choice._vote``); a source alone's after
        ours = [m for m in members if _group(names[idx[m]]) == "all"]
        members = ch.own_first(sub, ours, own) + [m for m in members if m not in ours]
        w = ch.vote_weights(sub, members, how, rec["pooled"] and by_dim)
        if scale is not None:
            w = [wi * scale(idx[m]) for wi, m in zip(w, members, strict=True)]
        return vote([rec["preds"][idx[m]] for m in members], q, w)

    def acc(p: np.ndarray | None) -> float | None:
        return None if p is None else 100.0 * float(np.mean(p == y))

    def dim(i: int) -> int:
        return max(int(rows[i]["dim"]), 1)

    job = groups["all"]
    voting = [job[m] for m in ch.voters([rows[i] for i in job], how.gate, rec["pooled"])]
    top = max((dim(i) for i in voting), default=1)
    out: dict[str, float | None] = {JOB: acc(vote_over(job))}
    for label, f in BY_DIM.items():
        scaled = vote_over(job, lambda i, f=f: f(dim(i), top), by_dim=False)  # type: ignore[misc]
        out[label] = acc(scaled)
    k = max(len(groups) - 1, 1)
    everything = list(range(len(names)))
    out[AMONG[0]] = acc(vote_over(everything))
    out[AMONG[1]] = acc(
        vote_over(everything, lambda i: 1.0 if _group(names[i]) == "all" else 1 / k)
    )
    out[AMONG[2]] = acc(
        vote_over(job, lambda i: 3.0 if names[i].startswith("dp_no_adaptation") else 1.0)
    )
    by_group = {g: p for g, idx in groups.items() if (p := vote_over(idx)) is not None}
    scores = {
        g: ch.scores_of(np.asarray(rec["x"]), p, rec["count_share"], rec["seed"])
        for g, p in by_group.items()
    }
    for variant, criterion in zip(AMONG[3:], ch.CRITERIA, strict=True):
        best = max(
            by_group, key=lambda g: np.nan_to_num(scores[g].get(criterion, np.nan), nan=-np.inf)
        )
        out[variant] = acc(by_group[best])
    return out


def voters_by_dim(rec: dict[str, Any]) -> dict[str, float]:
    """The mean accuracy (%) of the job's voters in each OT space's dimension ℓ (its own
    arms that the vote counts, ``choice.voters``), by ℓ."""
    from dpda.target_party import choice as ch

    job = [i for i, n in enumerate(rec["names"]) if _group(n) == "all"]
    sub = [rec["rows"][i] for i in job]
    members = [job[m] for m in ch.voters(sub, rec["how"].gate, rec["pooled"])]
    out: dict[str, float] = {}
    for d in sorted({int(rec["rows"][i]["dim"]) for i in members}):
        at = [i for i in members if int(rec["rows"][i]["dim"]) == d]
        out[str(d)] = float(
            np.mean([100.0 * np.mean(rec["preds"][i] == rec["labels"]) for i in at])
        )
    return out


def replay_cell(data_dir: str | None, what: str, seed: int, epsilon: float) -> dict[str, Any]:
    """One job (an Office-Caltech target letter, or a several-source family's name) at
    ``seed``, recorded and replayed."""
    from tests.bench.consortium import consortium_cell, several_cell

    if what in DOMAINS:
        assert data_dir is not None
        result, rec = _recorded(lambda: consortium_cell(data_dir, what, seed, epsilon))
    else:
        result, rec = _recorded(lambda: several_cell(what, seed, epsilon))
    return {
        "job": what, "seed": seed, "epsilon": epsilon, "kept": result["kept"],
        "dp_no_adaptation": result["dp_no_adaptation"], "variants": replay(rec),
        "voters_by_dim": voters_by_dim(rec),
    }  # fmt: skip


def run_replay(pool: Any, data_dir: str, seeds: int, epsilon: float) -> dict[str, Any]:
    """Every Office-Caltech task and several-source family at every seed, replayed."""
    from dpda.data.devsuite import SEVERAL
    from tests.bench.harness import cell, gather

    jobs = [*DOMAINS, *SEVERAL]
    cells = gather(
        [
            pool.submit(replay_cell, data_dir, j, seed, epsilon)
            for j in jobs
            for seed in range(seeds)
        ],
        "recorded consortium runs",
    )
    table = {
        j: {
            "kept": mean_of([c["kept"] for c in cells if c["job"] == j]),
            "dp_no_adaptation": mean_of([c["dp_no_adaptation"] for c in cells if c["job"] == j]),
            **{v: mean_of([c["variants"][v] for c in cells if c["job"] == j]) for v in VARIANTS},
            **{
                f"voters of ℓ = {d} (mean accuracy)": mean_of(
                    [c["voters_by_dim"].get(d) for c in cells if c["job"] == j]
                )
                for d in sorted({d for c in cells for d in c["voters_by_dim"]}, key=int)
            },
        }
        for j in jobs
    }
    print(f"\nThe vote over several sources, replayed on the recorded arms, ε = {epsilon:g} "
          "(mean over seeds)")  # fmt: skip
    heads = [f"→ {j}" if j in DOMAINS else j.split("-")[0] for j in jobs]
    print(f"{'':58}" + "".join(f"{h:>8}" for h in heads))
    for label in table[jobs[0]]:
        print(f"{label[:58]:58}" + "".join(f"{cell(table[j].get(label)):>8}" for j in jobs))
    return {"epsilon": epsilon, "runs": cells, "table": table}
