#!/usr/bin/python3
"""`kvrail top --registry etcd://host:port` with a real etcd, real decode sidecars and a real
bootstrap server that publish their metrics URLs there (--registry --metrics-port): every listed
sidecar and bootstrap server is a row; an
entry without a usable URL is a row naming its key; a sidecar killed with SIGKILL drops out of
the view once its lease expires (the registry is listed again at each refresh)."""

import base64
import json
import os
import random
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "tests", "registry"))
from etcd import Etcd  # noqa: E402  (the registry tests' etcd: one helper for every test)

TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))
KVRAIL = os.path.join(os.getcwd(), "tools", "kvrail")
TTL = 2
PREFIX = "/kvrail/v1/metrics/"


def field(line, key):
    for word in line.split():
        if word.startswith(key + "="):
            return word[len(key) + 1:]
    return ""


class TopRegistryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sidecars = []
        cls.etcd = Etcd()
        try:
            cls.metrics = [cls.start_decode(rank) for rank in range(2)]
            cls.bootstrap_metrics = cls.start_bootstrap()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start_decode(cls, rank):
        sidecar = subprocess.Popen(
            [KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint",
             "ipc:///tmp/kvrail-top-registry-%s-%d.sock" % (TAG, rank), "--tp-rank", str(rank),
             "--tp-size", "2", "--host", "127.0.0.1", "--tls", "tcp", "--registry",
             cls.etcd.url, "--registry-ttl", str(TTL), "--metrics-port", "0"],
            stdout=subprocess.PIPE, text=True)
        cls.sidecars.append(sidecar)
        line = sidecar.stdout.readline()
        assert line.startswith("sidecar ready"), line
        return field(line, "metrics")

    @classmethod
    def start_bootstrap(cls):
        bootstrap = subprocess.Popen(
            [KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", "0", "--registry",
             cls.etcd.url, "--registry-ttl", str(TTL), "--metrics-port", "0"],
            stdout=subprocess.PIPE, text=True)
        cls.sidecars.append(bootstrap)
        line = bootstrap.stdout.readline()
        assert line.startswith("bootstrap ready"), line
        cls.bootstrap_key = PREFIX + "bootstrap-127.0.0.1:" + field(line, "port")
        return field(line, "metrics")

    @classmethod
    def tearDownClass(cls):
        for sidecar in cls.sidecars:
            if sidecar.poll() is None:
                sidecar.kill()
            sidecar.wait()
            sidecar.stdout.close()
        for rank in range(2):  # a killed sidecar leaves its engine socket behind
            path = "/tmp/kvrail-top-registry-%s-%d.sock" % (TAG, rank)
            if os.path.exists(path):
                os.unlink(path)
        cls.etcd.stop()

    def frame(self):
        done = subprocess.run([KVRAIL, "top", "--registry", self.etcd.url, "--once", "--json",
                               "--interval", "0.3"], capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        return {e["endpoint"]: e for e in json.loads(done.stdout)["endpoints"]}

    def test_1_every_listed_sidecar_and_bootstrap_server_is_a_row(self):
        # The entry is written by the server's lease thread, shortly after its ready line.
        deadline = time.time() + 10
        while time.time() < deadline and self.bootstrap_key not in self.etcd.keys(PREFIX):
            time.sleep(0.05)
        self.assertIn(self.bootstrap_key, self.etcd.keys(PREFIX))
        frame = self.frame()
        self.assertEqual(sorted(frame), sorted(self.metrics + [self.bootstrap_metrics]))
        for rank, address in enumerate(self.metrics):
            self.assertTrue(frame[address]["up"], frame[address])
            self.assertEqual(frame[address]["role"], "decode")
            self.assertEqual(frame[address]["rank"], str(rank))
        self.assertTrue(frame[self.bootstrap_metrics]["up"], frame[self.bootstrap_metrics])
        self.assertEqual((frame[self.bootstrap_metrics]["kind"],
                          frame[self.bootstrap_metrics]["role"]), ("bootstrap", "bootstrap"))

    def test_2_an_entry_without_a_usable_url_is_a_row_naming_its_key(self):
        key = PREFIX + "decode-9-broken"
        self.etcd.call("/v3/kv/put", {"key": base64.b64encode(key.encode()).decode(),
                                      "value": base64.b64encode(b'{"role": "decode"}').decode()})
        try:
            frame = self.frame()
            self.assertFalse(frame[key]["up"])
            self.assertEqual(frame[key]["error"],
                             'registry entry %s: it has no "url" string' % key)
            self.assertTrue(all(frame[a]["up"] for a in self.metrics + [self.bootstrap_metrics]))
        finally:
            self.etcd.call("/v3/kv/deleterange",
                           {"key": base64.b64encode(key.encode()).decode()})

    def test_3_a_killed_sidecar_drops_out_when_its_lease_expires(self):
        self.sidecars[1].kill()
        self.sidecars[1].wait()
        deadline = time.time() + TTL + 10
        while time.time() < deadline and len(self.etcd.keys(PREFIX)) > 2:
            time.sleep(0.1)
        self.assertEqual(len(self.etcd.keys(PREFIX)), 2, "the killed sidecar's entry expired")
        frame = self.frame()
        self.assertEqual(sorted(frame), sorted([self.metrics[0], self.bootstrap_metrics]))
        self.assertTrue(frame[self.metrics[0]]["up"])

    def test_4_a_registry_that_does_not_answer_is_a_row_with_the_error(self):
        done = subprocess.run([KVRAIL, "top", "--registry", "etcd://127.0.0.1:1", "--once",
                               "--json", "--interval", "0.2"], capture_output=True, text=True,
                              timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        rows = json.loads(done.stdout)["endpoints"]
        self.assertEqual([r["endpoint"] for r in rows], ["etcd://127.0.0.1:1"])
        self.assertFalse(rows[0]["up"])
        self.assertIn("127.0.0.1:1", rows[0]["error"])
        done = subprocess.run([KVRAIL, "top", "--registry", "http://x:1", "--once"],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 1)
        self.assertIn("http://x:1", done.stderr)


if __name__ == "__main__":
    unittest.main()
