"""A plain gRPC backend (no xDS) for meshfed's interop tests.

Usage: upstream.py NAME

Binds 127.0.0.1 on a port the OS picks, serves grpc.health.v1.Health and a raw-bytes
method /harness.Echo/Say (no codegen) that answers b"served-by:<NAME>:<payload>", and
prints one line "listening on 127.0.0.1:<port>" once it accepts calls. Every unary
answer (Health/Check included) carries the trailing metadata "served-by: <NAME>", so a
caller of any method can tell which backend answered. Runs until killed.
"""
import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

name = sys.argv[1]


def say(request: bytes, context) -> bytes:
    return b"served-by:" + name.encode() + b":" + request


class ServedBy(grpc.ServerInterceptor):
    """Adds the trailing metadata "served-by: NAME" to every unary-unary answer."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        def tagged(request, context):
            context.set_trailing_metadata((("served-by", name),))
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            tagged,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=(ServedBy(),))
hs = health.HealthServicer()
hs.set("", health_pb2.HealthCheckResponse.SERVING)
health_pb2_grpc.add_HealthServicer_to_server(hs, server)
server.add_generic_rpc_handlers(
    (
        grpc.method_handlers_generic_handler(
            "harness.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
        ),
    )
)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(f"listening on 127.0.0.1:{port}", flush=True)
server.wait_for_termination()
