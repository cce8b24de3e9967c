"""A proxyless gRPC client driven line by line, for meshfed's interop tests.

Needs GRPC_XDS_BOOTSTRAP_CONFIG (inline bootstrap JSON) or GRPC_XDS_BOOTSTRAP.
Usage: client.py [deadline_seconds] [xds]
  deadline_seconds  per-RPC deadline, default 5
  xds               channels use xDS credentials (grpc.xds_channel_credentials with a
                    plaintext fallback): TLS as the clusters meshfed sends say, with the
                    bootstrap's certificate_providers; without it, plaintext always

Prints "ready", then reads commands from stdin, one per line:
  call N TARGET [METHOD] [KEY=VALUE ...]
                  N RPCs through a channel to "xds:///TARGET" (one channel per
                  target, kept for the whole run), each carrying the KEY=VALUE pairs as
                  request metadata (keys lowercase). METHOD is
                    say     /harness.Echo/Say (the default)
                    health  /grpc.health.v1.Health/Check
                  One line per RPC: "OK served-by:<backend>:<reply>" (for say the reply
                  is the backend's own answer; for health it is "health=<status>" and the
                  backend comes from the "served-by" trailing metadata) or
                  "ERR <status code> <details>"; then "END".
  quit            exits (so does the end of stdin).
"""
import sys

import grpc
import grpc.experimental
from grpc_health.v1 import health_pb2

deadline = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
xds_credentials = len(sys.argv) > 2 and sys.argv[2] == "xds"
channels = {}
sent = 0


def say(channel, metadata) -> str:
    global sent
    payload = f"ping{sent}"
    sent += 1
    method = channel.unary_unary("/harness.Echo/Say")
    return method(payload.encode(), timeout=deadline, metadata=metadata).decode()


def health(channel, metadata) -> str:
    method = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    reply, call = method.with_call(
        health_pb2.HealthCheckRequest(), timeout=deadline, metadata=metadata
    )
    backend = dict(call.trailing_metadata() or ()).get("served-by", "?")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return f"served-by:{backend}:health={status}"


METHODS = {"say": say, "health": health}


def call(target: str, count: int, method, metadata) -> None:
    channel = channels.get(target)
    if channel is None:
        if xds_credentials:
            credentials = grpc.xds_channel_credentials(
                grpc.experimental.insecure_channel_credentials()
            )
            channel = grpc.secure_channel(f"xds:///{target}", credentials)
        else:
            channel = grpc.insecure_channel(f"xds:///{target}")
        channels[target] = channel
    for _ in range(count):
        try:
            print(f"OK {method(channel, metadata)}", flush=True)
        except grpc.RpcError as e:
            details = (e.details() or "").replace("\n", " ")
            print(f"ERR {e.code().name} {details}", flush=True)


def parse(words):
    """(target, count, method, metadata) of a call command, or None."""
    if len(words) < 3 or words[0] != "call" or not words[1].isdigit():
        return None
    rest = words[3:]
    method = say
    if rest and "=" not in rest[0]:
        method = METHODS.get(rest.pop(0))
        if method is None:
            return None
    pairs = [w.split("=", 1) for w in rest]
    if any(len(p) != 2 or not p[0] for p in pairs):
        return None
    return words[2], int(words[1]), method, tuple((k, v) for k, v in pairs)


print("ready", flush=True)
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "quit":
        break
    command = parse(words)
    if command is None:
        print(f"ERR BAD_COMMAND {line.strip()}", flush=True)
    else:
        call(*command)
    print("END", flush=True)
for channel in channels.values():
    channel.close()
