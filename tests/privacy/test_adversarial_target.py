"""An authorized but hostile target against a real source daemon (mTLS on port 0, SQLite ledger).

Replays the attacks of the adversarial review (DESIGN.md §2a). The pinned target (its own cert and
key, so it passes the peer fingerprint check) talks to the source with the raw generated stub, so
nothing in ``target_party`` filters what it sends. Each attack must now be refused *before any
charge* (the source's ledger and ``GetLedger`` show no new entry) or answered with the honest
charge: the sensitivity of the whole map from the source's rows, in the source's units, with
noise that actually hides the rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from dpda.data.synthetic import two_domains
from dpda.deployment import make_deployment
from dpda.dp.calibration import calibrate_sigma
from dpda.dp.ledger import LedgerEntry, head_hash
from dpda.errors import PUBLIC_CATALOG, ConfigError
from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.policy import SCALING_MEAN_MAX, SCALING_STD_RANGE
from dpda.protocol import array_digest as digest
from dpda.service import serde, signing
from dpda.service.config import load_source
from dpda.service.tls import channel_credentials
from dpda.source_party.app import run_server
from tests.integration.helpers import SignedStub

pytestmark = pytest.mark.slow  # every test here takes seconds (real daemons or long runs)

DATASET = "synthetic"
N_ROWS, N_TARGET = 600, 500  # SourceDataset.synthetic_rows default
K = 40  # features of the synthetic source
N_CLASSES = 5
DELTA = 1.0 / (1.2 * N_ROWS)
ATTRIBUTE_BOUND = 0.5  # the source's own bound; deliberately not the default 1.0
ATTRIBUTE_POLICY = {
    "units": ["record", "attribute"],
    "attribute_unit_exposes_labels_and_membership": True,
    "releases": ["rows", "prototypes"],
    "attribute_bound": ATTRIBUTE_BOUND,
}
RPC_TIMEOUT = 30


# ------------------------------------------------------------------------------------ fixtures
class Peer:
    """The pinned target, hostile: the raw stub over its own mTLS credentials."""

    def __init__(self, stub: Any, rs: Any) -> None:
        self.stub = stub
        self.rs = rs

    # what the source itself holds, and what it tells the peer
    def local_entries(self) -> list[LedgerEntry]:
        return self.rs.handlers.ledger.store.entries(DATASET)

    def remote_entries(self) -> list[LedgerEntry]:
        resp = self.stub.GetLedger(pb.GetLedgerRequest(dataset=DATASET), timeout=RPC_TIMEOUT)
        return [LedgerEntry.from_json(e) for e in resp.entries_json]

    def snapshot(self) -> tuple[list[str], list[str], int]:
        """The ledger as the source holds it, as GetLedger shows it, and how many sessions the
        source has stored (a refused OpenSession must leave all three unchanged)."""
        with self.rs.handlers.lock:
            (sessions,) = self.rs.handlers.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
        return (
            [e.to_json() for e in self.local_entries()],
            [e.to_json() for e in self.remote_entries()],
            sessions,
        )

    def open(
        self,
        terms: dict[str, Any] | str,
        *,
        basis: np.ndarray | None = None,
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
    ) -> pb.OpenSessionResponse:
        req = pb.OpenSessionRequest(
            terms_json=terms if isinstance(terms, str) else json.dumps(terms)
        )
        if basis is not None:
            req.basis.CopyFrom(serde.to_pb(basis))
        if std is not None:
            req.scaling_mean.CopyFrom(serde.to_pb(np.zeros(K) if mean is None else mean))
            req.scaling_std.CopyFrom(serde.to_pb(std))
        return self.stub.OpenSession(req, timeout=RPC_TIMEOUT)

    def release(self, session_id: str) -> list[pb.BatchRelease]:
        head = head_hash(self.remote_entries())
        req = pb.ReleaseBatchesRequest(session_id=session_id, start=0, count=1, ledger_head=head)
        out = list(self.stub.ReleaseBatches(req, timeout=RPC_TIMEOUT))
        for msg in out:  # the source releases nothing new until the peer has countersigned
            self.countersign(LedgerEntry.from_json(msg.entry_json))
        return out

    def countersign(self, entry: LedgerEntry) -> None:
        sig = signing.sign(self.stub._key, entry.signed_message())
        req = pb.CountersignRequest(dataset=entry.dataset, seq=entry.seq, target_sig=sig)
        self.stub.Countersign(req, timeout=RPC_TIMEOUT)

    def refused(self, terms: dict[str, Any] | str, **kw: Any) -> tuple[str, str]:
        """Open a session that must be refused; nothing may reach the ledger. (code, detail)."""
        before = self.snapshot()
        with pytest.raises(grpc.RpcError) as e:
            self.open(terms, **kw)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert self.snapshot() == before  # no entry (local, GetLedger), no session
        code, _, message = (e.value.details() or "").partition(": ")
        assert code in ("INVALID_ARGUMENT", "POLICY_REFUSED", "TERMS_INVALID"), e.value.details()
        return code, message


def _deployment(tmp: Path, policy: dict[str, Any] | None, extra: dict[str, Any] | None = None):
    dataset: dict[str, Any] = {"name": DATASET, "kind": "synthetic", "epsilon": 100.0}
    dataset["delta"] = DELTA
    if policy is not None:
        dataset["policy"] = policy
    job = {"dataset": DATASET, "data_kind": "synthetic", "epsilon": 1.0, "delta": DELTA}
    return make_deployment(tmp, dataset=dataset, job=job, source_extra=extra, peer_cap=100.0)


@pytest.fixture
def peer_for(tmp_path_factory) -> Iterator[Any]:
    """``peer_for(policy, extra)``: a fresh real source daemon and the hostile pinned target."""
    stack: list[Any] = []

    def start(policy: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Peer:
        dep = _deployment(tmp_path_factory.mktemp("src"), policy, extra)
        server = run_server(load_source(dep.source_config))
        rs = server.__enter__()
        stack.append(server)
        k = dep.target_keys
        ch = grpc.secure_channel(f"127.0.0.1:{rs.port}", channel_credentials(k.cert, k.key, k.ca))
        stack.append(ch)
        return Peer(SignedStub(pb_grpc.SourceServiceStub(ch), dep), rs)

    yield start
    for obj in reversed(stack):
        if isinstance(obj, grpc.Channel):
            obj.close()
        else:
            obj.__exit__(None, None, None)


@pytest.fixture(scope="module")
def attribute_source(tmp_path_factory) -> Iterator[Peer]:
    """A source whose policy opts into the attribute unit and per-row releases."""
    yield from _module_source(tmp_path_factory, ATTRIBUTE_POLICY)


@pytest.fixture(scope="module")
def default_source(tmp_path_factory) -> Iterator[Peer]:
    """A source with no policy in its config: the default policy (whole records protected)."""
    yield from _module_source(tmp_path_factory, None)


def _module_source(tmp_path_factory, policy: dict[str, Any] | None) -> Iterator[Peer]:
    dep = _deployment(tmp_path_factory.mktemp("src"), policy)
    with run_server(load_source(dep.source_config)) as rs:
        k = dep.target_keys
        with grpc.secure_channel(
            f"127.0.0.1:{rs.port}", channel_credentials(k.cert, k.key, k.ca)
        ) as ch:
            yield Peer(SignedStub(pb_grpc.SourceServiceStub(ch), dep), rs)


# ------------------------------------------------------------------------------------- helpers
def _terms(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"dataset": DATASET, "epsilon": 1.0, "delta": DELTA}
    base.update(kw)
    return base


def _attribute_terms(**kw: Any) -> dict[str, Any]:
    return _terms(
        privacy_unit="attribute", release="rows", projection="target-pca", projection_dim=K, **kw
    )


def _basis(ell: int = K, seed: int = 7) -> np.ndarray:
    """An orthonormal (k, ℓ) basis the target chooses (ℓ = k: a rotation, nothing is lost)."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(K, K)))
    return q[:, :ell]


def _true_rows() -> tuple[np.ndarray, np.ndarray]:
    """The source's private rows and labels, known to this test (kind synthetic, raw)."""
    src = two_domains(N_ROWS, N_TARGET)[0]
    assert src.x.shape == (N_ROWS, K) and src.n_classes == N_CLASSES
    return src.x.astype(np.float64), src.y


def _z(rel: pb.BatchRelease) -> np.ndarray:
    return serde.from_pb(rel.z, dtype="<f8", ndim=2, finite=False)


def _assert_policy_refusal(code: str, message: str, *needles: str) -> None:
    """A refusal with public detail: the policy's (POLICY_REFUSED) or the terms' own rules
    (TERMS_INVALID, e.g. record-unit rows, refused by every party before any policy check)."""
    assert code in ("POLICY_REFUSED", "TERMS_INVALID"), (code, message)
    assert message.startswith(PUBLIC_CATALOG[code] + ": "), message
    detail = message[len(PUBLIC_CATALOG[code]) + 2 :]
    for needle in needles:
        assert needle in detail, (needle, detail)


# ----------------------------------------------------- 1. the target sets the unit of privacy
@pytest.mark.parametrize("field", ["feature_bound", "attribute_bound"])
def test_terms_cannot_carry_the_unit_of_privacy(attribute_source: Peer, field: str) -> None:
    """Attack 1a. Old code: the target's terms carried ``"feature_bound": 1e-12``; the source
    took it as the unit of privacy, calibrated the noise to a sensitivity 1e12 times too small
    and returned every source row to ~1e-10 while the ledger showed ε ≈ 0.35.

    Now the unit of privacy is the source's policy; an unknown terms field (the old
    ``feature_bound``, or the policy's own ``attribute_bound``) is refused at OpenSession, no
    entry."""
    terms = json.dumps({**_attribute_terms(epsilon=0.35), field: 1e-12})
    code, message = attribute_source.refused(terms, basis=_basis(), std=np.ones(K))
    assert code == "TERMS_INVALID" and message.endswith(
        f"{field}: not a session term (the source's policy, not the terms, sets the unit of "
        "privacy)"
    )


def test_tiny_column_std_is_refused(attribute_source: Peer) -> None:
    """Attack 1b. Old code: with ℓ = k and every column std 1e-12 the target's scaling
    multiplied the source's rows by 1e12 before noise calibrated in unscaled units: the rows came
    back to ~1e-10 at ε ≈ 0.35. Now a std outside the policy's bounds is refused, no entry."""
    lo, hi = SCALING_STD_RANGE
    code, message = attribute_source.refused(
        _attribute_terms(epsilon=0.35), basis=_basis(), std=np.full(K, 1e-12)
    )
    _assert_policy_refusal(code, message, "scaling_std", f"{lo:g}", f"{hi:g}")
    # one bad column is enough
    std = np.ones(K)
    std[17] = 1e-12
    code, message = attribute_source.refused(
        _attribute_terms(epsilon=0.35), basis=_basis(), std=std
    )
    _assert_policy_refusal(code, message, "scaling_std")


def test_small_allowed_std_is_charged_on_the_whole_map(attribute_source: Peer) -> None:
    """Attack 1c. Old code: a small std shrank the noise relative to the scaled rows (the
    sensitivity ignored the scaling): rows back to ~1e-10 at ε ≈ 0.35.

    Now the session opens, but the charged entry's sensitivity is b · max_j ‖M_j‖ / std_j
    (b the source's policy bound, M and std what this target sent) and the rows it gets back are
    not close to the true rows: every released row is at least 0.5 × the noise std (RMS per
    coordinate) from its *nearest* true scaled projected row, a lower bound on its error
    whatever the in-class shuffle."""
    p = attribute_source
    m = _basis()
    std = np.linspace(1e-3, 3e-3, K)  # small, inside the policy's bounds; one value per column
    mean = np.random.default_rng(3).normal(size=K)
    before = len(p.remote_entries())
    resp = p.open(_attribute_terms(epsilon=0.35), basis=m, mean=mean, std=std)
    assert resp.n_rows == N_ROWS and resp.n_features == K
    plan = json.loads(resp.plan_json)
    expected = ATTRIBUTE_BOUND * float(np.max(np.linalg.norm(m, axis=1) / std))
    assert plan["feature_sensitivity"] == pytest.approx(expected, rel=1e-9)
    assert plan["attribute_bound"] == ATTRIBUTE_BOUND

    (rel,) = p.release(resp.session_id)
    entries = p.remote_entries()
    assert len(entries) == before + 1
    entry = entries[-1]
    assert entry.privacy_unit == "attribute" and entry.session == resp.session_id
    features = entry.params["spec"]["features"]
    assert features["sensitivity"] == pytest.approx(expected, rel=1e-9)
    assert entry.params["sensitivity"] == pytest.approx(expected, rel=1e-9)
    assert entry.params["attribute_bound"] == ATTRIBUTE_BOUND
    # σ is the whole ε (the histogram is uncharged under the attribute relation), Theorem 2
    assert features["noise_multiplier"] == pytest.approx(calibrate_sigma(0.35, DELTA, "theorem2"))
    noise_std = features["noise_multiplier"] * expected  # from what this test sent, not the claim
    # the entry binds what the sensitivity was computed from
    assert entry.params["projection_sha256"] == digest(m)
    assert entry.params["scaling_std_sha256"] == digest(std)
    assert entry.params["scaling_mean_sha256"] == digest(mean)
    assert entry.dp_event["noise_multiplier"] == pytest.approx(features["noise_multiplier"])

    x, _ = _true_rows()
    truth = ((x - mean) / std) @ m  # (n, ℓ): what the map gives before noise
    z = _z(rel)
    assert z.shape == (N_ROWS, K) and np.all(np.isfinite(z))
    # squared distance from every released row to every true row; the nearest is a lower bound
    d2 = (z * z).sum(1)[:, None] - 2.0 * z @ truth.T + (truth * truth).sum(1)[None, :]
    nearest_rms = np.sqrt(np.maximum(d2.min(axis=1), 0.0).mean() / K)
    assert nearest_rms >= 0.5 * noise_std, (nearest_rms, noise_std)
    # and no released row is a near-copy of a true row (the old result: ~1e-10)
    assert np.sqrt(max(d2.min(), 0.0) / K) > 1e-3 * noise_std
    p.stub.CloseSession(pb.CloseSessionRequest(session_id=resp.session_id), timeout=RPC_TIMEOUT)


# ------------------------------------------------------------------ 2. overflow side channel
REFUSED_SCALINGS = {
    "std t/1.79e308 (subnormal)": (np.zeros(K), np.full(K, 1.0 / 1.79e308)),
    "std just below the floor": (np.zeros(K), np.full(K, SCALING_STD_RANGE[0] * 0.99)),
    "std above the ceiling": (np.zeros(K), np.full(K, SCALING_STD_RANGE[1] * 1.01)),
    "std zero": (np.zeros(K), np.zeros(K)),
    "std negative": (np.zeros(K), -np.ones(K)),
    "mean beyond the bound": (np.full(K, SCALING_MEAN_MAX * 1.01), np.ones(K)),
    "mean 1e308": (np.full(K, 1e308), np.ones(K)),
}


@pytest.mark.parametrize("unit", ["attribute", "record"])
@pytest.mark.parametrize("case", sorted(REFUSED_SCALINGS))
def test_overflowing_scaling_is_refused(attribute_source: Peer, case: str, unit: str) -> None:
    """Attack 2. Old code: a finite positive std t / 1.79e308 (t = 1) made (x − mean) / std
    overflow to ±inf exactly for the rows with |x_j − mean_j| > t; those became NaN rows and
    their count leaked at a charged ε of 0.002. Now such a scaling (and every one outside the
    policy's bounds) is refused at OpenSession, naming the field, before any charge."""
    mean, std = REFUSED_SCALINGS[case]
    if unit == "attribute":
        terms = _attribute_terms(epsilon=0.002)
    else:
        terms = _terms(
            privacy_unit="record",
            release="prototypes",
            projection="target-pca",
            projection_dim=K,
            epsilon=0.5,
        )
    code, message = attribute_source.refused(terms, basis=_basis(), mean=mean, std=std)
    field = "scaling_mean" if case.startswith("mean") else "scaling_std"
    _assert_policy_refusal(code, message, field)


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_non_finite_scaling_is_refused(attribute_source: Peer, bad: str) -> None:
    """Non-finite scaling never reaches the mechanism (refused while decoding, no entry)."""
    std = np.ones(K)
    std[0] = float(bad)
    code, _ = attribute_source.refused(_attribute_terms(), basis=_basis(), std=std)
    assert code == "INVALID_ARGUMENT"


def _extreme_scaling() -> tuple[np.ndarray, np.ndarray]:
    mean = np.where(np.arange(K) % 2 == 0, SCALING_MEAN_MAX, -SCALING_MEAN_MAX)
    return mean, np.full(K, SCALING_STD_RANGE[0])


def test_extreme_allowed_scaling_rows_stay_finite(attribute_source: Peer) -> None:
    """Attack 2, the allowed extremes (|mean| = 1e9, std at the floor 1e-9), attribute unit,
    a whole-dataset row release: the session opens, and every released value is finite and the
    release holds exactly n_rows rows (no row dropped or NaN'd, so nothing counts outliers).
    The charge is the honest b · max_j ‖M_j‖ / std_j."""
    p = attribute_source
    mean, std = _extreme_scaling()
    m = _basis()
    resp = p.open(_attribute_terms(epsilon=1.0), basis=m, mean=mean, std=std)
    (rel,) = p.release(resp.session_id)
    z = _z(rel)
    assert z.shape == (N_ROWS, K)
    assert np.all(np.isfinite(z))
    counts = serde.from_pb(rel.noisy_counts, dtype="<i8", ndim=1)
    assert counts.shape == (N_CLASSES,)
    entry = p.remote_entries()[-1]
    expected = ATTRIBUTE_BOUND * float(np.max(np.linalg.norm(m, axis=1) / std))
    assert entry.params["spec"]["features"]["sensitivity"] == pytest.approx(expected, rel=1e-9)


def test_extreme_allowed_scaling_prototypes_stay_finite(attribute_source: Peer) -> None:
    """Attack 2, the allowed extremes under the record unit (prototypes): every value finite,
    one row per class, sensitivity 2C (replace-one, rows clipped after the projection)."""
    p = attribute_source
    mean, std = _extreme_scaling()
    terms = _terms(release="prototypes", projection="target-pca", projection_dim=K, clip_norm=2.5)
    resp = p.open(terms, basis=_basis(), mean=mean, std=std)
    (rel,) = p.release(resp.session_id)
    z = _z(rel)
    assert z.shape == (N_CLASSES, K) and np.all(np.isfinite(z))
    entry = p.remote_entries()[-1]
    assert entry.params["spec"]["features"]["sensitivity"] == pytest.approx(2 * 2.5)


# --------------------------------------------------------------- 3. noise-free histogram
_ROWS = {"privacy_unit": "attribute", "release": "rows"}


@pytest.mark.parametrize(
    ("kw", "needles"),
    [
        ({"epsilon": 1e-25}, ("discrete-Laplace", "epsilon")),
        ({"histogram_share": 1e-30}, ("discrete-Laplace", "histogram_share")),
        ({"epsilon": 1e-25, **_ROWS}, ("discrete-Laplace", "epsilon")),
        ({"histogram_share": 1e-30, **_ROWS}, ("discrete-Laplace", "histogram_share")),
        # per-row minibatches: the Gaussian histogram's multiplier σ·ratio has the same floor
        (
            {
                "epsilon": 20.0,
                "batch_size": 60,
                "steps": 2,
                **_ROWS,
                "histogram_noise_ratio": 1e-30,
            },
            ("histogram noise multiplier",),
        ),
    ],
    ids=["eps-record", "share-record", "eps-attribute", "share-attribute", "ratio-minibatch"],
)
def test_noise_free_histogram_is_refused(
    attribute_source: Peer, kw: dict[str, Any], needles: tuple[str, ...]
) -> None:
    """Attack 3. Old code: ε = 1e-25 (or histogram_share = 1e-30) gave a discrete-Laplace
    parameter a ≈ 1e-25 at which numpy's geometric sampler saturated at INT64_MAX and the
    difference of two saturated draws was 0: the histogram came back as the exact class counts.
    Now the plan is refused against the policy's floors (discrete-Laplace parameter, histogram
    noise multiplier) before any charge, with a public POLICY_REFUSED detail saying which
    parameter is below which floor and what to change."""
    code, message = attribute_source.refused(_terms(projection="jl", projection_dim=10, **kw))
    _assert_policy_refusal(code, message, "below the floor", *needles)


# --------------------------------------------------------------- 10. defaults protect labels
def test_default_terms_get_record_unit_prototypes(default_source: Peer) -> None:
    """Attack 10. Old code: terms without a unit defaulted to the attribute unit and per-row
    releases, so any target received n_rows label-sorted rows whose labels an adversary reads
    off (100% at ε = 8 knowing a record's own features). Now default terms on a default-policy
    source give the default policy's release: record unit, prototypes (n_classes rows, not
    n_rows), replace-one."""
    p = default_source
    resp = p.open(_terms(projection="jl", projection_dim=10))  # no unit, no release, no relation
    assert resp.n_rows == N_ROWS and resp.n_classes == N_CLASSES
    (rel,) = p.release(resp.session_id)
    z = _z(rel)
    assert z.shape == (N_CLASSES, 10)  # per-class sums, not per-record rows
    assert np.all(np.isfinite(z))
    entry = p.remote_entries()[-1]
    assert entry.privacy_unit == "record"
    assert entry.neighbouring == "replace-one"
    assert entry.params["spec"]["features"]["unit"] == "record"
    assert entry.params["spec"]["features"]["relation"] == "replace-one"
    assert entry.params["spec"]["features"]["sensitivity"] == pytest.approx(2.0)  # 2C, C = 1
    assert entry.params["spec"]["histogram"]["sensitivity"] == 2


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"privacy_unit": "attribute"}, "privacy_unit"),
        ({"privacy_unit": "attribute", "release": "rows"}, "privacy_unit"),
        ({"release": "rows"}, "release"),
        ({"neighbouring": "add-remove"}, "neighbouring"),
        ({"release": "class-gaussians"}, None),  # offered by the default policy
    ],
    ids=["attribute", "attribute-rows", "rows", "add-remove", "class-gaussians-allowed"],
)
def test_default_policy_refuses_weaker_units(
    default_source: Peer, kw: dict[str, Any], field: str | None
) -> None:
    """Attack 10, asking for more: on a default-policy source, the attribute unit, per-row
    releases and add/remove neighbours are refused before any charge, naming the field."""
    terms = _terms(projection="jl", projection_dim=10, **kw)
    if field is None:
        sid = default_source.open(terms).session_id
        default_source.stub.CloseSession(
            pb.CloseSessionRequest(session_id=sid), timeout=RPC_TIMEOUT
        )
        return
    code, message = default_source.refused(terms)
    _assert_policy_refusal(code, message, field)


# ---------------------------------------------------------------------- seeded noise is marked
def test_seed_without_insecure_testing_is_refused_at_config_load(tmp_path) -> None:
    """A fixed seed makes every noise draw predictable: refused at config load unless the
    config says insecure_testing = true."""
    dep = _deployment(tmp_path, None, {"seed": 1})
    with pytest.raises(ConfigError, match="seed"):
        load_source(dep.source_config)


def test_seeded_source_marks_every_ledger_entry(peer_for) -> None:
    """With seed + insecure_testing, every ledger entry (feature release and PATE answer) says
    ``insecure_seed: true``, so no one mistakes it for a private release."""
    p = peer_for(None, {"seed": 1, "insecure_testing": True})
    resp = p.open(
        _terms(epsilon=2.0, projection="jl", projection_dim=10, pate_epsilon=0.5, pate_queries=4)
    )
    p.release(resp.session_id)
    head = head_hash(p.remote_entries())
    p.stub.QueryTeachers(
        pb.QueryTeachersRequest(
            session_id=resp.session_id,
            index=0,
            queries=serde.to_pb(np.ones((4, 10))),
            ledger_head=head,
        ),
        timeout=RPC_TIMEOUT,
    )
    entries = p.remote_entries()
    assert len(entries) == 2
    assert {e.params.get("kind", "features") for e in entries} == {"features", "pate"}
    assert all(e.params.get("insecure_seed") is True for e in entries)
