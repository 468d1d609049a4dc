"""TOML configuration for both daemons, validated by pydantic (frozen, unknown keys rejected).

Every validation error is reported as ``<file>: <dotted.field>: <problem>``. Relative paths are
resolved against the directory of the config file (``config_file`` reads and explains).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from dpda.dp.calibration import CalibrationMethod
from dpda.dp.mechanisms import Neighbouring, PrivacyUnit, ReleaseKind
from dpda.policy import PrivacyPolicy, TargetPrivacyPolicy
from dpda.public_source_terms import ReweightingTerms
from dpda.service.config_file import load
from dpda.terms import PATE_SHARE, RELEASE_DEPENDENT, SessionTerms, method_terms


def _term(name: str, terms: type[BaseModel] = SessionTerms, **changes: Any) -> Any:
    """A [job] field that is a session term as the terms declare it (a copy of its field, with
    ``changes``); a term whose default follows the unit and the release defaults to ``None``
    (the terms then decide)."""
    if terms is SessionTerms and name in RELEASE_DEPENDENT:
        changes = {"default": None, **changes}
    if not changes:
        return copy.copy(terms.model_fields[name])
    return FieldInfo.merge_field_infos(terms.model_fields[name], **changes)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TlsConfig(_Strict):
    cert: Path
    key: Path
    peer_ca: Path = Field(description="CA that signed the peer's certificate")


class SourceDataset(_Strict):
    name: str = Field(min_length=1, max_length=128)
    kind: Literal["office-caltech", "mnist-usps", "table", "synthetic"]
    path: Path | None = Field(
        default=None,
        description="data dir, or the table (.csv with or without a header, .parquet, .npy, .npz)",
    )
    label_column: str | int = Field(
        default=-1, description="kind table: the label column, by name or position (-1: last)"
    )
    id_column: str | None = Field(
        default=None, description="kind table: a column naming rows, not a feature (dropped)"
    )
    domain: str = Field(
        default="",
        description="office-caltech / mnist-usps: the domain; synthetic: 'target' serves the "
        "synthetic target's rows (the public-source deployment), else the source's",
    )
    labeled: bool = Field(
        default=True,
        description="kind table: false for rows without labels (a public-source deployment's data "
        "holder: only reweighting sessions read them)",
    )
    representation: Literal["raw", "sqrt", "rownorm", "l2"] = "raw"
    epsilon: float = Field(gt=0, le=100, description="dataset cap, all peers and sessions")
    delta: float | None = Field(
        default=None, gt=0, lt=1, description="default 1/(10·ns), well below 1/ns"
    )
    # The ledger's accountant. RDP was offered and broken (whole-batch releases refused, the
    # target and `ledger verify` recomputing with PLD): removed until every entry records and is
    # recomputed with its own accountant.
    accountant: Literal["pld"] = Field(default="pld", description="the ledger's accountant")
    policy: PrivacyPolicy = Field(
        default_factory=PrivacyPolicy,
        description=(
            "what this source allows (docs/privacy-model.md); the default protects whole records"
        ),
    )
    synthetic_rows: tuple[int, int] = Field(
        default=(600, 500), description="kind synthetic: (source rows, target rows)"
    )
    allow_raw_queries: bool = Field(
        default=False, description="PATE: accept queries in the raw feature space (opt-in)"
    )


class Peer(_Strict):
    name: str
    cert_fingerprint: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    signing_public_key: Path
    epsilon_cap: float = Field(gt=0, description="cap for this peer on each dataset")


def _host_name(v: str) -> str:
    """A Host header name: a DNS name or an IPv4 address, or an IPv6 address (kept bracketed,
    as in a Host header); never with a port."""
    import ipaddress

    bare = v[1:-1] if v.startswith("[") and v.endswith("]") else v
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?", v) or len(v) > 253:
            raise ValueError("not a host name or an IP address (no port)") from None
        return v.lower()
    return f"[{ip}]" if ip.version == 6 else str(ip)


_HostName = Annotated[str, AfterValidator(_host_name)]
# bounds on the job fields that size what the target allocates or how long a job runs (an
# unbounded synthetic_rows from the job API would try to allocate gigabytes); the ones the
# source also bounds (projection_dim, steps, PATE) match common/terms.py
MAX_SYNTHETIC_ROWS = 1_000_000
_Rows = Annotated[int, Field(ge=1, le=MAX_SYNTHETIC_ROWS)]


class AdminConfig(_Strict):
    enabled: bool = True
    listen: str = Field(default="127.0.0.1:0", description="host:port; port 0 picks a free one")
    token_file: Path | None = Field(
        default=None, description="bearer token; required when listen is not a loopback address"
    )
    allowed_hosts: tuple[_HostName, ...] = Field(
        default=(),
        max_length=16,
        description="Host header names accepted besides the listen host and the loopback names "
        "(e.g. the machine's DNS name when listening beyond loopback); no port",
    )

    @model_validator(mode="after")
    def _token_off_loopback(self) -> AdminConfig:
        from dpda.service.hosts import is_loopback

        host = self.listen.rsplit(":", 1)[0].strip("[]")
        if self.enabled and not is_loopback(host) and self.token_file is None:
            raise ValueError("token_file: required when the admin API listens beyond loopback")
        return self


class SourceLimits(_Strict):
    """Bounded work per caller: what one peer, or anyone holding a CA certificate,
    can make the source do. Requests past a limit get OVERLOADED (gRPC UNAVAILABLE)."""

    workers: int = Field(default=16, ge=2, le=256, description="gRPC handler threads")
    max_concurrent_rpcs: int = Field(
        default=64, ge=1, description="in flight at once, all callers (gRPC refuses the rest)"
    )
    peer_concurrency: int = Field(
        default=8, ge=1, description="in flight at once per pinned peer (≤ workers - 2)"
    )
    anonymous_concurrency: int = Field(
        default=1, ge=0, description="in flight at once for all unpinned callers together"
    )
    peer_rate: float = Field(default=500.0, gt=0, description="requests/s per pinned peer")
    anonymous_rate: float = Field(
        default=5.0, gt=0, description="requests/s for all unpinned callers together"
    )
    sessions_per_peer: int = Field(default=32, ge=1, description="open sessions per peer")
    session_idle_s: float = Field(
        default=3600.0, gt=0, description="a session unused this long is closed"
    )
    plan_seconds: float = Field(
        default=10.0, gt=0, description="time limit of a session's release plan (calibration)"
    )
    peer_cpu_seconds: float = Field(
        default=30.0,
        gt=0,
        description="CPU seconds per peer and window for the work the peer sizes (PATE "
        "teachers and votes, planned-terms hints); past it: OVERLOADED",
    )
    peer_work_queue: int = Field(
        default=4,
        ge=0,
        le=1024,
        description="a peer's heavy requests (those under peer_cpu_seconds) run one at a time; "
        "this many more wait their turn, each at most peer_cpu_window_s; past it: OVERLOADED",
    )
    reweight_bytes_per_session: int = Field(
        default=64 * 2**20, ge=1, description="stored reweighting outputs of one session (bytes)"
    )
    reweight_bytes_per_peer: int = Field(
        default=512 * 2**20, ge=1, description="stored reweighting outputs of one peer (bytes)"
    )
    reweight_outputs_max_age_s: float = Field(
        default=86400.0,
        gt=0,
        allow_inf_nan=False,
        description="stored reweighting outputs older than this are deleted (their storage "
        "freed); a retry of such a block is refused, never drawn or charged again",
    )
    peer_cpu_window_s: float = Field(
        default=60.0, gt=0, description="the window of peer_cpu_seconds"
    )

    @model_validator(mode="after")
    def _fits(self) -> SourceLimits:
        if self.peer_concurrency > self.workers - 1:
            raise ValueError("peer_concurrency: must leave a worker free (≤ workers - 1)")
        return self


class SourceConfig(_Strict):
    state_dir: Path
    listen: str = "127.0.0.1:0"
    tls: TlsConfig
    signing_key: Path
    datasets: list[SourceDataset] = Field(min_length=1)
    peers: list[Peer] = Field(default_factory=list)
    retain_payloads: bool = False
    max_batches_per_request: int = Field(default=1000, ge=1)
    seed: int | None = Field(
        default=None, description="fixes all noise: refused unless insecure_testing = true"
    )
    insecure_testing: bool = Field(
        default=False,
        description="allow a fixed seed (tests only); every ledger entry then records it",
    )
    admin: AdminConfig = Field(default_factory=AdminConfig)
    limits: SourceLimits = Field(default_factory=SourceLimits)

    @model_validator(mode="after")
    def _seed_is_insecure(self) -> SourceConfig:
        if self.seed is not None and not self.insecure_testing:
            raise ValueError(
                "seed: a fixed seed makes every noise draw predictable; it is refused unless "
                "insecure_testing = true (tests only)"
            )
        return self


class TargetJob(_Strict):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dataset: str = _term("dataset", description="the source's dataset name")
    data_kind: Literal["office-caltech", "mnist-usps", "table", "synthetic"]
    data_path: Path | None = None
    label_column: str | int | None = Field(
        default=None,
        description="data_kind table: a label column used only to score the job (by name it "
        "may be absent); none: the target's rows are unlabeled",
    )
    id_column: str | None = Field(
        default=None, description="data_kind table: the column predictions are keyed by"
    )
    predictions: Path | None = Field(
        default=None,
        description="where to write the predictions (.csv or .parquet); "
        "default state_dir/predictions.csv",
    )
    domain: str = ""
    representation: Literal["raw", "sqrt", "rownorm", "l2"] = "raw"
    scaling: Literal["auto", "zscore", "uniform"] = Field(
        default="auto",
        description="the column scaling of the OT space: auto is uniform for source-space "
        "releases and z-score otherwise",
    )
    synthetic_rows: tuple[_Rows, _Rows] = Field(
        default=(600, 500), description="data_kind synthetic: (source rows, target rows)"
    )
    # the session terms a job sets, declared once by SessionTerms (default, bounds and help);
    # None for a term the unit and the release decide (SessionTerms then fills it in)
    epsilon: float = _term("epsilon")
    delta: float | None = _term(
        "delta",
        default=None,
        description="the source's δ for the dataset; default: the value the source publishes",
    )
    privacy_unit: PrivacyUnit = _term("privacy_unit")
    neighbouring: Neighbouring = _term("neighbouring")
    projection: Literal["source", "jl", "target-pca"] | None = _term("projection")
    projection_dim: int | None = _term("projection_dim")
    batch_size: int = _term("batch_size")
    steps: int = _term("steps")
    noise_multiplier: float = _term("noise_multiplier")
    histogram_noise_ratio: float = _term("histogram_noise_ratio")
    max_steps: int = _term("max_steps")
    histogram_share: float | None = _term("histogram_share")
    calibration: CalibrationMethod | None = _term("calibration")
    clip_norm: float = _term("clip_norm")
    cells: int | None = _term("cells")
    reg_e: float = Field(default=0.02, gt=0)
    reg_g: float = Field(default=0.5, ge=0)
    classifier: Literal[
        "1nn", "logistic", "mlp", "target-logistic", "target-knn", "target-spread"
    ] = "1nn"
    transport_step: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="aggregate releases: how far each class point moves toward its OT image",
    )
    refine: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="aggregate releases: then how far each class point moves toward the mean "
        "of the target rows it labels (one self-labelling step; 0: none)",
    )
    keep: Literal["dpda", "better"] = Field(
        default="better",
        description="the model kept: dpda, or the better of DPDA and the release without "
        "adaptation by the label-free estimate",
    )
    select: Literal["circular", "none"] = Field(
        default="circular",
        description="choose reg_e/reg_g without target labels on the received releases "
        "(post-processing); none: keep reg_e and reg_g",
    )
    method: Literal["dpda", "pate", "dpda+pate"] = "dpda"
    release: ReleaseKind | None = _term("release")
    synthetic_points: int = _term("synthetic_points")
    synthetic_rows_per_point: int = _term("synthetic_rows_per_point")
    sinkhorn_steps: int = _term("sinkhorn_steps")
    sinkhorn_reg: float = _term("sinkhorn_reg")
    sinkhorn_debias: float = _term("sinkhorn_debias")
    sinkhorn_learning_rate: float = _term("sinkhorn_learning_rate")
    cost: Literal["sqeuclidean", "metric"] = _term("cost")
    metric_share: float = _term("metric_share")
    metric_dim: int = _term("metric_dim")
    metric_pairs: int = _term("metric_pairs")
    metric_margin: float = _term("metric_margin")
    metric_clip: float = _term("metric_clip")
    metric_steps: int = _term("metric_steps")
    metric_learning_rate: float = _term("metric_learning_rate")
    pate_share: float = Field(
        default=PATE_SHARE, gt=0, lt=1, description="dpda+pate: PATE's ε share"
    )
    # the job's PATE queries: the terms' pate_queries when the method asks PATE (method_terms)
    pate_queries: int = Field(default=100, ge=1, le=100_000)
    pate_teachers: int = _term("pate_teachers")
    pate_aggregator: Literal["lnmax", "gnmax"] = _term("pate_aggregator")
    pate_space: Literal["projected", "raw"] = _term("pate_space")
    # the public-source deployment: this job's rows are public and labeled, the serving
    # daemon's rows private; the job drives a private reweighting of its own rows
    setting: Literal["private-source", "public-source"] = Field(
        default="private-source",
        description="private-source: the serving daemon's labeled rows are private (DPDA); "
        "public-source: this job's labeled rows are public and the serving daemon's unlabeled "
        "rows private",
    )
    reweighting_method: Literal["noisy-fw", "noisy-md", "single-stage"] = _term(
        "method", ReweightingTerms
    )
    reweighting_steps: int = _term("steps", ReweightingTerms)
    reweighting_block: int = Field(
        default=100, ge=1, le=100_000, description="public-source: steps per request"
    )
    reweighting_dim: int = Field(
        default=20, ge=1, le=512, description="public-source: the shared space's dimension"
    )

    def terms(self) -> SessionTerms:
        """The session terms of this job: every term it sets (``TERMS_OF_JOB``), SessionTerms'
        defaults for the rest, then its method's channels (``method_terms``)."""
        base = terms_of(self)
        if self.method == "dpda":
            return base
        return method_terms(base, self.method, self.pate_queries, self.pate_share)

    def with_changes(self, **changes: Any) -> TargetJob:
        """This job with ``changes``, validated as a [job] table is (every error names its
        field): the one way a job is derived from another."""
        return TargetJob.model_validate({**self.model_dump(), **changes})


# the session terms a [job] table sets: its fields that SessionTerms declares, but pate_queries,
# which reaches the terms through the job's method
TERMS_OF_JOB = tuple(
    name
    for name in TargetJob.model_fields
    if name in SessionTerms.model_fields and name != "pate_queries"
)


def terms_of(settings: object) -> SessionTerms:
    """The session terms ``settings`` set, each term of ``TERMS_OF_JOB`` read by its name (a
    [job] table, ``dpda simulate``'s parsed flags); SessionTerms' defaults for the rest."""
    return SessionTerms.model_validate({name: getattr(settings, name) for name in TERMS_OF_JOB})


class ComputeConfig(_Strict):
    """Where the target's per-batch transport and mapping run. The job's process
    alone talks to the source and keeps the ledger; workers only fit releases it hands them."""

    scheduler: str = Field(
        default="inprocess",
        pattern=r"^(inprocess|local|(tcp|tls)://[^\s/]+:\d+)$",
        description="inprocess (default): in the job's process; local: a Dask LocalCluster on "
        "this machine's loopback, TLS with credentials made for the job, no dashboard; "
        "tls://host:8786: an existing Dask scheduler, with tls_ca_file, tls_cert and tls_key; "
        "tcp://host:8786: an existing scheduler without TLS, only with "
        "allow_unauthenticated_scheduler",
    )
    tls_ca_file: Path | None = Field(
        default=None, description="tls:// scheduler: the CA that signed the cluster's certificates"
    )
    tls_cert: Path | None = Field(
        default=None, description="tls:// scheduler: the job's client certificate"
    )
    tls_key: Path | None = Field(default=None, description="tls:// scheduler: its private key")
    allow_unauthenticated_scheduler: bool = Field(
        default=False,
        description="accept a tcp:// scheduler: anyone who reaches it can run code as the job, "
        "read the target's rows and its signing key",
    )
    workers: int = Field(default=1, ge=1, le=1024, description="local: worker processes")
    memory_per_worker: str | None = Field(
        default=None,
        pattern=r"^\s*\d+(\.\d+)?\s*[kmgtKMGT]?(i?[bB])?\s*$",
        description="e.g. 4GiB: a local worker's memory limit, and the size a batch's fit must "
        "fit in (larger batches are split); default: the workers' own limit",
    )
    threads_per_worker: int = Field(
        default=1, ge=1, le=256, description="Dask threads (and BLAS threads) per worker"
    )

    @model_validator(mode="after")
    def _authenticated(self) -> ComputeConfig:
        if self.scheduler.startswith("tcp://") and not self.allow_unauthenticated_scheduler:
            raise ValueError(
                "scheduler: a tcp:// scheduler lets anyone who reaches it run code as the job; "
                "use tls:// (with tls_ca_file, tls_cert, tls_key) or set "
                "allow_unauthenticated_scheduler = true"
            )
        if self.scheduler.startswith("tls://"):
            for name in ("tls_ca_file", "tls_cert", "tls_key"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name}: required with a tls:// scheduler")
        return self


class JobSource(_Strict):
    """One more source of a job over several sources (``[[sources]]`` in the target's TOML):
    its name in the report, its address, pinned certificate, signing key and CA."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    address: str
    fingerprint: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    signing_public_key: Path
    peer_ca: Path | None = Field(
        default=None,
        description="the CA that signed this source's certificate (default: tls.peer_ca)",
    )


class TargetConfig(_Strict):
    state_dir: Path
    source_address: str
    source_fingerprint: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    source_signing_public_key: Path
    source_name: str = Field(
        default="source",
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="the name of the source above in a job over several sources",
    )
    sources: list[JobSource] = Field(
        default_factory=list,
        description="more sources of the job (a job over several sources): each one opens its "
        "own session and charges its own ledger; the target keeps a ledger per source under "
        "state_dir/sources/<name>",
    )
    tls: TlsConfig
    signing_key: Path
    budget_epsilon: float = Field(gt=0, description="the target's own cap for the dataset")
    job: TargetJob
    retain_payloads: bool = False
    timeout_s: float = Field(default=120.0, gt=0)
    reconnect_s: float = Field(
        default=60.0, ge=0, description="keep retrying an unavailable source this long"
    )
    max_reruns: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="starts of one job against one source without it finishing; more are "
        "refused (a finished job clears its count)",
    )
    admin: AdminConfig = Field(default_factory=AdminConfig)
    privacy: TargetPrivacyPolicy = Field(
        default_factory=TargetPrivacyPolicy,
        description="the target's own policy for its rows; the default sends no "
        "exact statistic or row",
    )
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    seed: int | None = Field(
        default=None,
        description="fixes the job's seed and the noise of the target's own disclosures (as "
        "`dpda simulate --seed` does): refused unless insecure_testing = true",
    )
    insecure_testing: bool = Field(
        default=False, description="allow a fixed seed (tests and rehearsed configs only)"
    )

    def each_source(self) -> dict[str, TargetConfig]:
        """A job over several sources: each source's own config (its address, pin, keys and
        CA, and its own state folder ``state_dir/sources/<name>`` for its ledger and the
        job's resume file), by name. Empty for a job over one source."""
        if not self.sources:
            return {}
        own = JobSource(
            name=self.source_name,
            address=self.source_address,
            fingerprint=self.source_fingerprint,
            signing_public_key=self.source_signing_public_key,
        )
        out: dict[str, TargetConfig] = {}
        for s in [own, *self.sources]:
            tls = (
                self.tls
                if s.peer_ca is None
                else self.tls.model_copy(update={"peer_ca": s.peer_ca})
            )
            out[s.name] = self.model_copy(
                update={
                    "source_address": s.address,
                    "source_fingerprint": s.fingerprint,
                    "source_signing_public_key": s.signing_public_key,
                    "source_name": s.name,
                    "sources": [],
                    "tls": tls,
                    "state_dir": self.state_dir / "sources" / s.name,
                }
            )
        return out

    @model_validator(mode="after")
    def _sources_are_named_once(self) -> TargetConfig:
        names = [self.source_name, *(s.name for s in self.sources)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"sources: the name {twice[0]!r} is given twice (source_name too)")
        return self

    @model_validator(mode="after")
    def _seed_is_insecure(self) -> TargetConfig:
        if self.seed is not None and not self.insecure_testing:
            raise ValueError(
                "seed: a fixed seed makes the target's own noise predictable; it is refused "
                "unless insecure_testing = true (tests only)"
            )
        return self


def load_source(path: str | Path) -> SourceConfig:
    return load(path, SourceConfig)  # type: ignore[return-value]


def load_target(path: str | Path) -> TargetConfig:
    return load(path, TargetConfig)  # type: ignore[return-value]
