"""A proxyless gRPC client driven line by line, for meshfed's interop tests.

Needs GRPC_XDS_BOOTSTRAP_CONFIG (inline bootstrap JSON) or GRPC_XDS_BOOTSTRAP.
Usage: client.py [deadline_seconds]   (per-RPC deadline, default 5)

Prints "ready", then reads commands from stdin, one per line:
  call TARGET N   N RPCs of /harness.Echo/Say through grpc.insecure_channel("xds:///TARGET")
                  (one channel per target, kept for the whole run); one line per RPC:
                  "OK <reply>" or "ERR <status code> <details>", then "END".
  quit            exits (so does the end of stdin).
"""
import sys

import grpc

deadline = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
channels = {}
sent = 0


def call(target: str, count: int) -> None:
    global sent
    channel = channels.get(target)
    if channel is None:
        channel = grpc.insecure_channel(f"xds:///{target}")
        channels[target] = channel
    say = channel.unary_unary("/harness.Echo/Say")
    for _ in range(count):
        payload = f"ping{sent}"
        sent += 1
        try:
            reply = say(payload.encode(), timeout=deadline)
            print(f"OK {reply.decode()}", flush=True)
        except grpc.RpcError as e:
            details = (e.details() or "").replace("\n", " ")
            print(f"ERR {e.code().name} {details}", flush=True)


print("ready", flush=True)
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "quit":
        break
    if words[0] == "call" and len(words) == 3:
        call(words[1], int(words[2]))
    else:
        print(f"ERR BAD_COMMAND {line.strip()}", flush=True)
    print("END", flush=True)
for channel in channels.values():
    channel.close()
