"""Thin gRPC servicer: decode (serde) → the RPC family's method (``SourceHandlers``) → encode.
No math, no policy."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from dpda.data.preprocessing import Scaling
from dpda.errors import DpdaError, public_message
from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.service import serde
from dpda.service.status import abort_with
from dpda.service.tls import peer_fingerprint
from dpda.source_party.handlers import SourceHandlers

log = logging.getLogger("dpda.source")


def _abort(
    context: grpc.ServicerContext, exc: BaseException, on_refusal: Callable[[str], None]
) -> None:
    code, message = public_message(exc)
    on_refusal(code)
    if not isinstance(exc, DpdaError):
        log.exception("internal error")
    else:
        log.warning("refused: %s (%s)", code, exc)
    abort_with(context, exc)


def _ledger_length(request: Any) -> int:
    """The length of the target's ledger a request states (-1: not stated)."""
    return int(request.ledger_length) if request.HasField("ledger_length") else -1


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: SourceServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except Exception as exc:
            _abort(context, exc, self.on_refusal)

    return wrapper


class SourceServicer(pb_grpc.SourceServiceServicer):
    def __init__(
        self, handlers: SourceHandlers, on_refusal: Callable[[str], None] = lambda code: None
    ) -> None:
        self.h = handlers
        self.on_refusal = on_refusal  # the daemon counts refusals by public code

    @staticmethod
    def _peer(context: grpc.ServicerContext) -> str:
        return peer_fingerprint(context) or ""

    @_guard
    def DescribeDataset(
        self, request: pb.DescribeDatasetRequest, context: Any
    ) -> pb.DescribeDatasetResponse:
        return pb.DescribeDatasetResponse(
            **self.h.sessions.describe(
                self._peer(context), request.dataset, request.planned_terms_json
            )
        )

    @_guard
    def OpenSession(self, request: pb.OpenSessionRequest, context: Any) -> pb.OpenSessionResponse:
        scaling = None
        if request.HasField("scaling_mean"):
            scaling = Scaling(
                serde.from_pb(request.scaling_mean, dtype="<f8", ndim=1),
                serde.from_pb(request.scaling_std, dtype="<f8", ndim=1),
            )
        basis = (
            serde.from_pb(request.basis, dtype="<f8", ndim=2) if request.HasField("basis") else None
        )
        info, plan_json, sig = self.h.sessions.open_session(
            self._peer(context),
            request.terms_json,
            scaling,
            basis,
            request.session_id,
            request.target_sig,
            request.target_claim_json,
        )
        return pb.OpenSessionResponse(
            session_id=info.session_id,
            n_rows=info.n_rows,
            n_features=info.n_features,
            n_classes=info.n_classes,
            plan_json=plan_json,
            source_sig=sig,
        )

    @_guard
    def GetProjection(
        self, request: pb.GetProjectionRequest, context: Any
    ) -> pb.GetProjectionResponse:
        m = self.h.sessions.projection(self._peer(context), request.session_id)
        return pb.GetProjectionResponse(projection=serde.to_pb(m))

    def ReleaseBatches(
        self, request: pb.ReleaseBatchesRequest, context: Any
    ) -> Iterator[pb.BatchRelease]:
        try:
            for sr in self.h.batches.release_batches(
                self._peer(context),
                request.session_id,
                request.start,
                request.count,
                request.ledger_head,
                _ledger_length(request),
            ):
                stats = sr.release.statistics_vector()
                yield pb.BatchRelease(
                    standardization=None if stats is None else serde.to_pb(stats),
                    index=sr.release.index,
                    z=serde.to_pb(sr.release.z),
                    noisy_counts=serde.to_pb(sr.release.noisy_counts),
                    entry_json=sr.entry.to_json(),
                    payload_sha256=sr.entry.payload_sha256,
                    source_sig=sr.source_sig,
                    catch_up_json=[e.to_json() for e in sr.catch_up],
                )
        except Exception as exc:
            _abort(context, exc, self.on_refusal)

    @_guard
    def QueryTeachers(
        self, request: pb.QueryTeachersRequest, context: Any
    ) -> pb.QueryTeachersResponse:
        queries = serde.from_pb(request.queries, dtype="<f8", ndim=2)
        ans, entry, catch_up = self.h.pate.query_teachers(
            self._peer(context),
            request.session_id,
            request.index,
            queries,
            request.ledger_head,
            _ledger_length(request),
        )
        return pb.QueryTeachersResponse(
            labels=serde.to_pb(ans.labels),
            entry_json=entry.to_json(),
            payload_sha256=entry.payload_sha256,
            source_sig=entry.source_sig,
            catch_up_json=[e.to_json() for e in catch_up],
        )

    @_guard
    def Countersign(self, request: pb.CountersignRequest, context: Any) -> pb.CountersignResponse:
        self.h.sync.countersign(
            self._peer(context), request.dataset, request.seq, request.target_sig
        )
        return pb.CountersignResponse()

    @_guard
    def GetLedger(self, request: pb.GetLedgerRequest, context: Any) -> pb.GetLedgerResponse:
        entries, length, head, pending = self.h.sync.ledger_entries(
            self._peer(context), request.dataset, request.since_seq
        )
        return pb.GetLedgerResponse(
            entries_json=entries, length=length, head=head, uncountersigned=pending
        )

    @_guard
    def RestoreLedger(
        self, request: pb.RestoreLedgerRequest, context: Any
    ) -> pb.RestoreLedgerResponse:
        length, head = self.h.sync.restore_ledger(
            self._peer(context), request.dataset, list(request.entries_json)
        )
        return pb.RestoreLedgerResponse(length=length, head=head)

    @_guard
    def CloseSession(
        self, request: pb.CloseSessionRequest, context: Any
    ) -> pb.CloseSessionResponse:
        pending = self.h.close_session(self._peer(context), request.session_id)
        return pb.CloseSessionResponse(uncountersigned=pending)

    @_guard
    def OpenReweighting(
        self, request: pb.OpenReweightingRequest, context: Any
    ) -> pb.OpenReweightingResponse:
        rows = serde.from_pb(request.rows, dtype="<f8", ndim=2)
        labels = (
            serde.from_pb(request.labels, dtype="<f8", ndim=1)
            if request.HasField("labels")
            else None
        )
        scaling = Scaling(
            serde.from_pb(request.scaling_mean, dtype="<f8", ndim=1),
            serde.from_pb(request.scaling_std, dtype="<f8", ndim=1),
        )
        basis = serde.from_pb(request.basis, dtype="<f8", ndim=2)
        rs, plan_json, sig = self.h.reweights.open(
            self._peer(context),
            request.terms_json,
            rows,
            labels,
            scaling,
            basis,
            float(request.scale),
            request.session_id,
            request.target_sig,
        )
        return pb.OpenReweightingResponse(
            session_id=rs.session_id,
            n_rows=int(self.h.releasers[rs.dataset].domain.x.shape[0]),
            plan_json=plan_json,
            source_sig=sig,
        )

    @_guard
    def ReweightSteps(
        self, request: pb.ReweightStepsRequest, context: Any
    ) -> pb.ReweightStepsResponse:
        out, entry, catch_up = self.h.reweights.steps(
            self._peer(context),
            request.session_id,
            request.start,
            request.count,
            request.ledger_head,
            _ledger_length(request),
        )
        resp = pb.ReweightStepsResponse(
            entry_json=entry.to_json(),
            payload_sha256=entry.payload_sha256,
            source_sig=entry.source_sig,
            catch_up_json=[e.to_json() for e in catch_up],
        )
        if out.dtype.kind == "i":
            resp.vertices.CopyFrom(serde.to_pb(out))
        else:
            resp.gradients.CopyFrom(serde.to_pb(out))
        return resp
