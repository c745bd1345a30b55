#!/usr/bin/python3
"""What a scheduler iteration costs an engine in Python (issue 15), against a real decode sidecar
holding that many rooms: the call each iteration makes, drain_events() (the room outcomes the
sidecar pushed, taken without a round trip or a wait), and a batched poll_states() of every room
in flight in one round trip (for an engine that reconciles by polling).

The rooms are real: each was Expected against a real bootstrap server where one prefill rank
registered (CACHEPD section 2.1): a ZeroMQ PULL socket of this script that takes the decode's
registration and pre-allocations and never answers, so every room waits for its transfer for
the whole run. The baseline, in the same run, is the same iteration with one room in flight: the
ratio is what a poll of many rooms pays beyond the round trip itself.

    bazel build -c opt //tools:kvrail && \\
        /usr/bin/python3 bench/engine_api/iteration_bench.py [--rooms 256] [--iterations 2000] [--json]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from kvrail_engine import SidecarClient  # noqa: E402

KVRAIL = os.path.join(ROOT, "bazel-bin", "tools", "kvrail")
CONTRACT = open(os.path.join(ROOT, "examples", "decode_contract_tp1.json")).read()
MANIFEST = open(os.path.join(ROOT, "examples", "manifest.json")).read()
TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))


def start(argv, ready):
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    if not line.startswith(ready):
        raise SystemExit("%s did not start: %r" % (argv[1], line))
    return process, line


def measure(call, iterations):
    """Seconds per call, one per iteration."""
    times = []
    for _ in range(iterations):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return times


def summary(times):
    ordered = sorted(times)
    return {"mean_us": statistics.fmean(times) * 1e6,
            "p50_us": ordered[len(ordered) // 2] * 1e6,
            "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rooms", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    bootstrap, line = start([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", "0"],
                            "bootstrap ready")
    port = int(line.split("port=")[1].split()[0])
    endpoint = "ipc:///tmp/kvrail-iteration-bench-%s.sock" % TAG
    shm = "/kvrail-iteration-bench-%s" % TAG
    sidecar = None
    silent_rank = zmq.Context.instance().socket(zmq.PULL)
    silent_rank.setsockopt(zmq.LINGER, 0)
    rank_port = silent_rank.bind_to_random_port("tcp://127.0.0.1")
    try:
        body = json.dumps({"role": "Prefill", "world_size": 1, "dp_size": 1,
                           "rank_ip": "127.0.0.1", "rank_port": rank_port, "engine_rank": 0,
                           "cache_layout": CONTRACT}).encode()
        urllib.request.urlopen(urllib.request.Request(
            "http://127.0.0.1:%d/route" % port, data=body, method="PUT"), timeout=10).close()
        sidecar, _ = start([KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint", endpoint,
                            "--tls", "tcp", "--waiting-timeout", "3600"], "sidecar ready")
        with open("/dev/shm" + shm, "wb") as f:
            f.truncate(1 << 20)
        client = SidecarClient(endpoint, timeout=10.0)
        client.attach_shm(shm, CONTRACT)
        rooms = list(range(1, args.rooms + 1))
        for room in rooms:
            client.expect(room, "127.0.0.1:%d" % port, MANIFEST)
        waiting = client.poll_states(rooms)
        in_flight = sum(1 for s in waiting.values() if s.status.name != "FAILED")
        if in_flight != len(rooms):
            raise SystemExit("only %d of %d rooms are in flight" % (in_flight, len(rooms)))
        measure(lambda: client.poll_states(rooms), 200)  # warm up
        drain = summary(measure(client.drain_events, args.iterations))
        one = summary(measure(lambda: client.poll_states(rooms[:1]), args.iterations))
        many = summary(measure(lambda: client.poll_states(rooms), args.iterations))
        client.close()
    finally:
        if sidecar is not None:
            sidecar.terminate()
            sidecar.wait(timeout=10)
        bootstrap.terminate()
        bootstrap.wait(timeout=10)
        silent_rank.close()
        if os.path.exists("/dev/shm" + shm):
            os.unlink("/dev/shm" + shm)
    result = {"rooms": args.rooms, "iterations": args.iterations, "drain_events": drain,
              "poll_one_room": one, "poll_all_rooms": many,
              "poll_ratio_mean": many["mean_us"] / one["mean_us"]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("a scheduler iteration with %d rooms in flight: Python client, ipc:// to a decode "
          "sidecar" % args.rooms)
    print("  %-34s %10s %10s %10s" % ("", "mean", "p50", "p99"))
    for name, row in (("drain_events() (each iteration)", drain),
                      ("poll_states(1 room) (baseline)", one),
                      ("poll_states(%d rooms)" % args.rooms, many)):
        print("  %-34s %7.1f us %7.1f us %7.1f us" % (name, row["mean_us"], row["p50_us"],
                                                      row["p99_us"]))
    print("  a poll of %d rooms costs %.2fx a poll of one" % (args.rooms,
                                                           result["poll_ratio_mean"]))


if __name__ == "__main__":
    main()
