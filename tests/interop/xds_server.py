"""An xDS-enabled gRPC server for meshfed's interop tests.

Needs GRPC_XDS_BOOTSTRAP_CONFIG (inline bootstrap JSON) with
`server_listener_resource_name_template` and, for mTLS, `certificate_providers`.
Usage: xds_server.py NAME PORT

Serves /harness.Echo/Say (raw bytes, no codegen) on 127.0.0.1:PORT through
grpc.server(xds=True) with xDS server credentials (plaintext fallback), so the
listener meshfed sends decides TLS and authorization. The answer is
b"served-by:<NAME>:<payload> peer=<identity>" where identity is the client
certificate's identity (its URI SAN) when the call came over mTLS, else "none".
Prints "started" once the server started (it serves only after its listener
arrived), then runs until killed.
"""
import sys
from concurrent import futures

import grpc

name = sys.argv[1]
port = int(sys.argv[2])


def say(request: bytes, context) -> bytes:
    identities = context.peer_identities() or []
    peer = ",".join(i.decode() for i in identities) or "none"
    return b"served-by:" + name.encode() + b":" + request + b" peer=" + peer.encode()


server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), xds=True)
server.add_generic_rpc_handlers(
    (
        grpc.method_handlers_generic_handler(
            "harness.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
        ),
    )
)
credentials = grpc.xds_server_credentials(grpc.insecure_server_credentials())
server.add_secure_port(f"127.0.0.1:{port}", credentials)
server.start()
print("started", flush=True)
server.wait_for_termination()
