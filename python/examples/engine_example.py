#!/usr/bin/python3
"""A decode engine rank driving its kvrail sidecar: the few calls an engine author needs.

    python3 -m kvrail_engine.examples.engine_example \
        --sidecar ipc:///tmp/kvrail-d0.sock --arena-bytes 67108864 \
        --contract decode_contract.json --bootstrap 127.0.0.1:8998 \
        --manifest room7_manifest.json --room 7

(after `pip install ./python`; from a checkout, `PYTHONPATH=bazel-bin/python:python
/usr/bin/python3 python/examples/engine_example.py ...` after `bazel build //python:all`.)

--arena-bytes asks the sidecar to allocate the KV arena where its data plane's peers write
fastest (over UCX shared memory, UCX's own segment) and maps it here; --arena /kvrail-d0
instead shares a POSIX shared-memory arena the engine made itself.
"""

import argparse
import sys

from kvrail_engine import SidecarClient, SidecarError, TransferPoll


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecar", required=True, help="the sidecar's engine API endpoint")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--arena-bytes", type=int,
                       help="have the sidecar allocate a KV arena of this many bytes")
    where.add_argument("--arena", help="the engine's own KV arena, by shared-memory name")
    parser.add_argument("--contract", required=True, help="the arena's contract (JSON file)")
    parser.add_argument("--bootstrap", required=True, help="the prefill's bootstrap host:port")
    parser.add_argument("--manifest", required=True, help="the room's destination manifest")
    parser.add_argument("--room", type=int, required=True)
    args = parser.parse_args()

    with SidecarClient(args.sidecar) as sidecar:
        try:
            # Once per process: the KV arena. Either the sidecar allocates it (arena.view is
            # then the engine's window on the pages, arena.placement where they live) ...
            if args.arena_bytes is not None:
                arena = sidecar.attach_allocated(args.arena_bytes, open(args.contract).read())
                print("arena: %d bytes from the sidecar, placement %s"
                      % (len(arena.view), arena.placement))
            else:  # ... or the engine shares the arena it allocated itself.
                sidecar.attach_shm(args.arena, open(args.contract).read())
            # Per request: the pages are allocated; ask for the prefill's cache.
            sidecar.expect(args.room, args.bootstrap, open(args.manifest).read())
        except SidecarError as error:
            print("sidecar refused: %s" % error, file=sys.stderr)
            return 1
        # Wait for the outcome; meanwhile the engine keeps decoding other requests.
        event = sidecar.next_event(timeout=60.0)
        if event is None:
            print("room %d: no outcome within 60 s" % args.room, file=sys.stderr)
            return 1
        if event.status != TransferPoll.SUCCESS:
            print("room %d failed: %s" % (event.room, event.reason), file=sys.stderr)
            return 1
        print("room %d landed: %d bytes, bootstrap token %d"
              % (event.room, event.bytes, event.bootstrap_token))
        return 0


if __name__ == "__main__":
    sys.exit(main())
