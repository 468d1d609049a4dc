"""Deny-by-default authorization: which peer role may call which RPC.

The peer's identity is the fingerprint of its client certificate (mTLS). A peer listed in the
source's config has the role ``target``; anything else has no role and may call nothing but the
unary health ``Check`` (the streaming ``Watch`` is for pinned peers only). ``POLICY`` must name
every method of the generated servicer (a test ties them).
"""

from __future__ import annotations

SERVICE = "dpda.v1.SourceService"

POLICY: dict[str, frozenset[str]] = {
    f"/{SERVICE}/OpenSession": frozenset({"target"}),
    f"/{SERVICE}/GetProjection": frozenset({"target"}),
    f"/{SERVICE}/ReleaseBatches": frozenset({"target"}),
    f"/{SERVICE}/QueryTeachers": frozenset({"target"}),
    f"/{SERVICE}/Countersign": frozenset({"target"}),
    f"/{SERVICE}/GetLedger": frozenset({"target"}),
    f"/{SERVICE}/CloseSession": frozenset({"target"}),
    "/grpc.health.v1.Health/Check": frozenset({"target", "anonymous"}),
    # a Watch stream holds a server thread for as long as the caller likes: pinned peers only
    # (on 9ac3bc1 eight anonymous Watch streams took all 8 workers and starved the target)
    "/grpc.health.v1.Health/Watch": frozenset({"target"}),
}


def allowed(method: str, role: str | None) -> bool:
    roles = POLICY.get(method)
    return roles is not None and (role or "anonymous") in roles


def role_of(fingerprint: str | None, peers: set[str]) -> str | None:
    return "target" if fingerprint is not None and fingerprint in peers else None


class AuthInterceptor:
    """gRPC server interceptor enforcing ``POLICY`` from the client certificate's fingerprint."""

    def __init__(self, peer_fingerprints: set[str]) -> None:
        self.peers = set(peer_fingerprints)

    def __new__(cls, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        import grpc

        # subclass grpc.ServerInterceptor lazily so this module imports without grpc
        if not issubclass(cls, grpc.ServerInterceptor):
            cls = type(cls.__name__, (cls, grpc.ServerInterceptor), {})
        return object.__new__(cls)

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201
        import grpc

        from .tls import peer_fingerprint

        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return None
        peers = self.peers

        def deny(context) -> None:  # noqa: ANN001
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED: not authorized")

        if handler.unary_unary:
            inner = handler.unary_unary

            def unary(request, context):  # noqa: ANN001, ANN202
                if not allowed(method, role_of(peer_fingerprint(context), peers)):
                    deny(context)
                return inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            inner_s = handler.unary_stream

            def stream(request, context):  # noqa: ANN001, ANN202
                if not allowed(method, role_of(peer_fingerprint(context), peers)):
                    deny(context)
                yield from inner_s(request, context)

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        return handler
