#!/usr/bin/python3
"""python/examples/reference_engine.py end to end: a real bootstrap server, real sidecars (every
one with --verify-digest, so that a Success means the digest of the bytes matched) and one
reference engine process per rank, for P = D, P > D, P < D and two prefill DP groups; and with
a decode sidecar, or the prefill's, killed mid-run: the engines report the rooms failed with the
reason and end, none left waiting."""

import os
import random
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "tests", "python"))

from processes import started, stop  # noqa: E402

TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))
KVRAIL = os.path.join(os.getcwd(), "tools", "kvrail")
ENGINE = os.path.join(os.getcwd(), "python", "examples", "reference_engine.py")
SHAPE = ["--layers", "2", "--pages", "64"]


def contract_for(tp, directory):
    path = os.path.join(directory, "contract-tp%d.json" % tp)
    with open(path, "w") as f:
        f.write(subprocess.check_output([KVRAIL, "contract", "--tp", str(tp)] + SHAPE, text=True))
    size = int(subprocess.check_output(
        [KVRAIL, "contract", "--tp", str(tp), "--arena-bytes"] + SHAPE, text=True))
    return path, size


class Deployment:
    def __init__(self, prefill_tp, decode_tp, dp=1, rooms=8, timeout=90, prefill_args=()):
        self.processes = []
        self.engines = {}
        self.directory = os.environ.get("TEST_TMPDIR", "/tmp")
        bootstrap, line = started([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", "0"],
                                  "bootstrap ready")
        self.processes.append(bootstrap)
        self.bootstrap = "127.0.0.1:%s" % line.split("port=")[1].split()[0]
        prefill_contract, prefill_bytes = contract_for(prefill_tp, self.directory)
        decode_contract, decode_bytes = contract_for(decode_tp, self.directory)
        common = ["--rooms", str(rooms), "--seed", "3", "--timeout", str(timeout)]
        self.sidecars = {}
        # The prefill ranks first: a decode's route needs their registrations at the bootstrap.
        for g in range(dp):
            for r in range(prefill_tp):
                name = "prefill-g%d-r%d" % (g, r)
                endpoint = self.sidecar(name, ["--role", "prefill", "--bootstrap", self.bootstrap,
                                               "--tp-size", str(prefill_tp), "--tp-rank", str(r),
                                               "--dp-size", str(dp), "--dp-rank", str(g)]
                                       + list(prefill_args))
                self.engine(name, ["--role", "prefill", "--sidecar", endpoint, "--contract",
                                   prefill_contract, "--arena-bytes", str(prefill_bytes),
                                   "--dp-size", str(dp), "--dp-rank", str(g)] + common)
        for r in range(decode_tp):
            name = "decode-r%d" % r
            endpoint = self.sidecar(name, ["--role", "decode", "--tp-size", str(decode_tp),
                                           "--tp-rank", str(r)])
            self.engine(name, ["--role", "decode", "--sidecar", endpoint, "--contract",
                               decode_contract, "--arena-bytes", str(decode_bytes),
                               "--bootstrap", self.bootstrap] + common)

    def sidecar(self, name, args):
        endpoint = "ipc:///tmp/kvrail-refloop-%s-%s.sock" % (TAG, name)
        process, _ = started([KVRAIL, "sidecar", "--engine-endpoint", endpoint, "--host",
                              "127.0.0.1", "--tls", "tcp", "--verify-digest",
                              "--heartbeat-interval", "1", "--heartbeat-failures", "2"] + args,
                             "sidecar ready")
        self.processes.append(process)
        self.sidecars[name] = process
        return endpoint

    def engine(self, name, args):
        process, _ = started([sys.executable, ENGINE] + args, "attached")
        self.processes.append(process)
        self.engines[name] = process

    def results(self, timeout=120):
        """Each engine's exit status and its output lines."""
        out = {}
        for name, process in self.engines.items():
            text, _ = process.communicate(timeout=timeout)
            out[name] = (process.returncode, text)
        return out

    def close(self):
        stop(self.processes)


class ReferenceLoopTest(unittest.TestCase):
    def check_shape(self, prefill_tp, decode_tp, dp=1):
        deployment = Deployment(prefill_tp, decode_tp, dp)
        try:
            results = deployment.results()
        finally:
            deployment.close()
        for name, (code, text) in results.items():
            self.assertEqual(code, 0, "%s:\n%s" % (name, text))
            self.assertIn(" 0 failed", text, name)

    def test_p1_d1(self):
        self.check_shape(1, 1)

    def test_p2_d1(self):
        self.check_shape(2, 1)

    def test_p1_d2(self):
        self.check_shape(1, 2)

    def test_two_prefill_dp_groups(self):
        self.check_shape(1, 1, dp=2)

    def test_a_decode_sidecar_killed_fails_its_engines_rooms_and_nobody_hangs(self):
        # The prefill fails a room that a dead decode rank never pre-allocates after
        # --bootstrap-timeout; the engines give up on what is left after --timeout.
        deployment = Deployment(1, 2, rooms=400, timeout=20,
                                prefill_args=["--bootstrap-timeout", "3"])
        try:
            os.kill(deployment.sidecars["decode-r1"].pid, signal.SIGKILL)
            results = deployment.results()
        finally:
            deployment.close()
        code, text = results["decode-r1"]
        self.assertEqual(code, 1, text)
        self.assertIn("the sidecar is lost", text)
        self.assertNotIn("Traceback", text)
        # The other ranks end too, within their deadline: the prefill's rooms that needed the
        # dead decode fail (its heartbeat), the healthy decode's with them or succeed.
        for name in ("prefill-g0-r0", "decode-r0"):
            self.assertIn("summary:", results[name][1], name)

    def test_a_prefill_sidecar_killed_fails_the_decodes_rooms_within_the_heartbeat_window(self):
        # The decode sidecar probes the prefill ranks its rooms wait on every heartbeat interval
        # (1 s here), finds the dead one's socket refusing connections and fails the rooms it
        # owes; its engine reports them and ends, none left to its own deadline.
        deployment = Deployment(1, 1, rooms=12, timeout=60)
        try:
            os.kill(deployment.sidecars["prefill-g0-r0"].pid, signal.SIGKILL)
            results = deployment.results()
        finally:
            deployment.close()
        code, text = results["prefill-g0-r0"]
        self.assertEqual(code, 1, text)
        self.assertIn("the sidecar is lost", text)
        code, text = results["decode-r0"]
        self.assertEqual(code, 1, text)
        self.assertIn("summary:", text)  # a room may have landed before the kill
        self.assertNotIn("failed deadline", text)  # every room ended by the sidecar's word
        self.assertIn("is gone (its CachePD socket refuses connections)", text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
