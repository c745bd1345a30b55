"""python3 -m kvrail_engine: an operator's look at a kvrail sidecar through its engine API."""

import argparse
import json
import os
import sys
import time
from typing import List, Optional

from kvrail_engine.client import SidecarClient, SidecarError
from kvrail_engine.room_event import RoomState, TransferPoll

DESCRIPTION = """\
Talk to a kvrail sidecar through its engine API (docs/ENGINE-API.md), as an engine rank does.

How to reach a sidecar: ENDPOINT is the sidecar's --engine-endpoint, the ZeroMQ socket it binds
beside its engine rank:
  ipc:///tmp/kvrail-d0.sock   a socket file on this host (mode 0600: its owner's alone)
  tcp://127.0.0.1:PORT        a tcp port (the sidecar's "sidecar ready engine=..." line says
                              which, when it was started with port 0)
The sidecar that serves it:
  kvrail sidecar --role decode --engine-endpoint ipc:///tmp/kvrail-d0.sock
  kvrail sidecar --role prefill --bootstrap HOST:PORT --engine-endpoint ipc:///tmp/kvrail-p0.sock
A tcp engine API of a sidecar started with --curve-key and --curve-allowed (docs/SECURITY.md)
admits CURVE clients only: give --curve-key (an engine key, `kvrail keygen --role engine --rank
<the sidecar's rank>`, whose .pub is in the sidecar's --curve-allowed) and --curve-server-key
(the sidecar's .pub). An ipc endpoint needs neither.

In a program: `from kvrail_engine import SidecarClient` (see the package's README.md)."""

EPILOG = """\
examples:
  python3 -m kvrail_engine ping ipc:///tmp/kvrail-d0.sock
  python3 -m kvrail_engine stats tcp://127.0.0.1:5600 --curve-key engine-0.key \\
      --curve-server-key decode-0.pub
  python3 -m kvrail_engine poll ipc:///tmp/kvrail-d0.sock 7 8

Exit status: 0 when the sidecar answered, 1 with one line on stderr when it did not (no
sidecar there, no reply within --timeout, a refusal), 2 for bad arguments."""


def _endpoint(text: str) -> str:
    """An engine API endpoint argument: ipc://PATH or tcp://HOST:PORT."""
    if text.startswith("ipc://") and len(text) > len("ipc://"):
        return text
    host, _, port = text[len("tcp://"):].rpartition(":")
    if text.startswith("tcp://") and host and port.isdigit() and 0 < int(port) < 65536:
        return text
    raise argparse.ArgumentTypeError(
        "%r: an engine endpoint is ipc://PATH or tcp://HOST:PORT (the sidecar's "
        "--engine-endpoint)" % text)


def _room(text: str) -> int:
    if not text.isdigit() or int(text) >= 1 << 64:
        raise argparse.ArgumentTypeError("%r: a room is an unsigned 64-bit integer" % text)
    return int(text)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python3 -m kvrail_engine", description=DESCRIPTION,
                                  epilog=EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("endpoint", type=_endpoint, metavar="ENDPOINT",
                        help="the sidecar's engine API: ipc://PATH or tcp://HOST:PORT")
    common.add_argument("--timeout", type=float, default=3.0, metavar="S",
                        help="seconds to wait for the sidecar's answer (default 3)")
    common.add_argument("--curve-key", metavar="FILE",
                        help="CURVE (tcp): this client's engine .key (kvrail keygen)")
    common.add_argument("--curve-server-key", metavar="KEY",
                        help="CURVE (tcp): the sidecar's .pub file, or its Z85 public key")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "ping", parents=[common],
        help="is a sidecar there? one Stats call: its answer time, rooms, peers, engines",
        description="One Stats call (open to any client: it does not make this client the "
                    "engine): prints the round trip and a summary of the sidecar's tables.")
    commands.add_parser(
        "stats", parents=[common], help="every counter and table size of the sidecar, as JSON",
        description="The sidecar's SidecarStats (proto/kvrail/v1/engine.proto), one JSON "
                    "object, field by field.")
    poll = commands.add_parser(
        "poll", parents=[common], help="the TransferPoll state of rooms, with failure reasons",
        description="Poll the rooms' states (CACHEPD 7.1). Poll is an engine's request: the "
                    "sidecar refuses it (\"another engine drives this sidecar\") while its "
                    "engine is connected, and otherwise serves this client as its engine for "
                    "as long as it is connected.")
    poll.add_argument("rooms", type=_room, nargs="+", metavar="ROOM")
    return top


def state_line(room: int, state: RoomState) -> str:
    """What `poll` prints of one room: its status, a Failed one's cause and reason, and a
    decode Success's bootstrap token, cached tokens and first token logprob (CACHEPD 12.9)."""
    cause = " (%s)" % state.cause if state.cause else ""
    reason = " " + state.reason if state.reason else ""
    outcome = ""
    if state.status == TransferPoll.SUCCESS:
        logprob = state.first_token_logprob
        outcome = (" bootstrap_token=%d cached_tokens=%d first_token_logprob=%s"
                   % (state.bootstrap_token, state.cached_tokens,
                      "none" if logprob is None else repr(logprob)))
    return "room %d %s%s%s%s" % (room, state.status.name, cause, reason, outcome)


def run(args: argparse.Namespace) -> int:
    endpoint = args.endpoint
    if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://"):]):
        raise SidecarError("engine API %s: no socket at %s (is the sidecar running, with this "
                           "--engine-endpoint?)" % (endpoint, endpoint[len("ipc://"):]))
    with SidecarClient(endpoint, timeout=args.timeout, curve_key=args.curve_key,
                       curve_server_key=args.curve_server_key) as client:
        if args.command == "poll":
            for room, state in client.poll_states(args.rooms).items():
                print(state_line(room, state))
            return 0
        start = time.monotonic()
        stats = client.stats()
        took = time.monotonic() - start
    if args.command == "stats":
        print(json.dumps(stats, indent=2))
        return 0
    # A sidecar older than the role field answers "" for it: say so rather than nothing.
    role = stats["role"] or "sidecar of unknown role"
    print("sidecar %s answered in %.1f ms: %s rank %s of %s, pid %s; engines %s, rooms %s "
          "(succeeded %s, failed %s), registrations %s, data-plane peers %s, bytes sent %s; "
          "arena %s bytes, %s layers"
          % (endpoint, took * 1000, role, stats["tp_rank"], stats["tp_size"], stats["pid"],
             stats["engines"], stats["rooms"], stats["rooms_succeeded"], stats["rooms_failed"],
             stats["registrations"], stats["data_plane_peers"], stats["bytes_sent"],
             stats["arena_bytes"], stats["layers"]))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except SidecarError as error:
        hint = ""
        if "no reply" in str(error) and args.endpoint.startswith("tcp://"):
            hint = "; a CURVE sidecar answers only the --curve-key clients it admits"
        print("kvrail_engine %s: %s%s" % (args.command, error, hint), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
