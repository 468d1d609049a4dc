"""A daemon's Prometheus metrics: what its gRPC handlers record, what ``/metrics`` of its admin
API serves."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)


class Metrics:
    """The daemon's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.releases = Counter(
            "dpda_releases", "DP releases sent", ["dataset", "mechanism"], registry=self.registry
        )
        self.release_bytes = Counter(
            "dpda_release_bytes",
            "bytes of DP releases sent",
            ["dataset", "mechanism"],
            registry=self.registry,
        )
        self.epsilon = Gauge(
            "dpda_epsilon_spent",
            "ε of all events of the dataset after the latest entry of the peer (a bound for "
            "the attribute relation; see dpda_epsilon_by_relation for the record level)",
            ["dataset", "peer"],
            registry=self.registry,
        )
        self.epsilon_by_relation = Gauge(
            "dpda_epsilon_by_relation",
            "ε of the dataset per neighbouring relation (record: +Inf once any attribute-unit "
            "release exists, since those give no record-level guarantee)",
            ["dataset", "relation"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "dpda_refusals",
            "requests refused, by public error code",
            ["code"],
            registry=self.registry,
        )
        self.refusals_unaudited = Counter(
            "dpda_refusals_unaudited",
            "refusals of unpinned callers not written to the audit log (one a second is)",
            ["code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "dpda_rpc_latency_seconds", "gRPC handling time", ["method"], registry=self.registry
        )
