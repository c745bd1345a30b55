#!/usr/bin/python3
"""--registry etcd://host:port end to end, with a real etcd, a real bootstrap server, and real
prefill and decode sidecars driven through the Python engine client: the decode publishes its
descriptor (and metrics address) leased; the prefill takes the descriptor from the registry, no
handshake; a decode killed with SIGKILL loses its entry within the lease ttl and the prefill
fails its pre-allocated rooms naming the expiry (its heartbeat probes are a minute apart, so only
the lease can tell)."""

import json
import os
import urllib.request
import random
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "registry"))

from etcd import Etcd  # noqa: E402
from kvrail_engine import SidecarClient, TransferPoll  # noqa: E402

TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))
KVRAIL = os.path.join(os.getcwd(), "tools", "kvrail")
TMP = os.environ.get("TEST_TMPDIR", "/tmp")
SHAPE = ["--layers", "2", "--pages", "64"]
TTL = 2


def started(argv, ready, stderr=None):
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = process.stdout.readline()
    assert line.startswith(ready), (argv[:3], line)
    return process, line


def field(line, key):
    for word in line.split():
        if word.startswith(key + "="):
            return word[len(key) + 1:]
    return ""


def start_node(owner):
    """A bootstrap server without --registry, appended to `owner.processes`; sets
    `owner.bootstrap` (its address), `owner.contract` and `owner.arena_bytes` (SHAPE's, tp 1)."""
    bootstrap, line = started([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", "0"],
                              "bootstrap ready")
    owner.processes.append(bootstrap)
    owner.bootstrap = "127.0.0.1:%s" % field(line, "port")
    owner.contract = subprocess.check_output([KVRAIL, "contract", "--tp", "1"] + SHAPE,
                                             text=True)
    owner.arena_bytes = int(subprocess.check_output(
        [KVRAIL, "contract", "--tp", "1", "--arena-bytes"] + SHAPE, text=True))


def stop_all(owner):
    """Closes `owner.clients` and kills `owner.processes`, the last started first."""
    for client in owner.clients:
        client.close()
    for process in reversed(owner.processes):
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()


class Rooms:
    """Rooms routed between `self.prefill_client` and `self.decode_client` through the bootstrap
    server at `self.bootstrap` (a mixin of the TestCases here)."""

    def event(self, client, room, statuses, seconds=20):
        deadline = time.time() + seconds
        while time.time() < deadline:
            event = client.next_event(timeout=deadline - time.time())
            if event is not None and event.room == room and event.status in statuses:
                return event
        self.fail("no %s event for room %d within %d s" % (statuses, room, seconds))

    def route(self, room, ready=True):
        """Room `room`: pre-allocated by the decode at the prefill; with `ready`, sent."""
        self.prefill_client.begin(room)
        self.decode_client.expect(room, self.bootstrap, block_tables=[[1, 2]], window=(0, 32))
        self.event(self.prefill_client, room, (TransferPoll.BOOTSTRAPPED,))
        if ready:
            self.prefill_client.ready(room, bootstrap_token=7, block_tables=[[1, 2]],
                                      window=(0, 32))

    def landed(self, room):
        """Routes room `room`; the decode's final status for it."""
        self.route(room)
        return self.event(self.decode_client, room,
                          (TransferPoll.SUCCESS, TransferPoll.FAILED)).status

    def prefill_log_text(self):
        """What the prefill sidecar logged so far (`self.prefill_log`, at prefill_log_path)."""
        self.prefill_log.flush()
        with open(self.prefill_log_path) as f:
            return f.read()

    def await_registry_read(self, session, seconds=10):
        """Waits until the prefill says its watch read `session`'s descriptor: its watch may see
        a key after etcd has it, and a room that comes first takes a handshake (CI saw that)."""
        read = "descriptor of session %s read from the registry" % session
        deadline = time.monotonic() + seconds
        while read not in self.prefill_log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIn(read, self.prefill_log_text())


class RegistryTest(Rooms, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.processes = []
        cls.clients = []
        cls.etcd = Etcd()
        try:
            cls.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start(cls):
        start_node(cls)
        common = ["--host", "127.0.0.1", "--tls", "tcp", "--registry", cls.etcd.url]
        cls.prefill_log_path = os.path.join(TMP, "prefill-%s.log" % TAG)
        cls.prefill_log = open(cls.prefill_log_path, "w")
        prefill_endpoint = "ipc:///tmp/kvrail-registry-%s-p.sock" % TAG
        prefill, _ = started([KVRAIL, "sidecar", "--role", "prefill", "--engine-endpoint",
                              prefill_endpoint, "--bootstrap", cls.bootstrap,
                              "--heartbeat-interval", "60"] + common, "sidecar ready",
                             stderr=cls.prefill_log)
        cls.processes.append(prefill)
        decode_endpoint = "ipc:///tmp/kvrail-registry-%s-d.sock" % TAG
        cls.decode, line = started([KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint",
                                    decode_endpoint, "--registry-ttl", str(TTL),
                                    "--metrics-port", "0"] + common, "sidecar ready")
        cls.processes.append(cls.decode)
        cls.session = field(line, "session")
        cls.decode_metrics = field(line, "metrics")
        cls.prefill_client = SidecarClient(prefill_endpoint, timeout=10.0)
        cls.clients.append(cls.prefill_client)
        cls.prefill_client.attach_allocated(cls.arena_bytes, cls.contract)
        cls.decode_client = SidecarClient(decode_endpoint, timeout=10.0)
        cls.clients.append(cls.decode_client)
        cls.decode_client.attach_allocated(cls.arena_bytes, cls.contract)

    @classmethod
    def tearDownClass(cls):
        stop_all(cls)
        if hasattr(cls, "prefill_log"):
            cls.prefill_log.close()
        cls.etcd.stop()

    def test_1_the_decode_publishes_its_descriptor_and_metrics_leased(self):
        key = "/kvrail/v1/sessions/" + self.session
        self.assertIsNotNone(self.etcd.await_key(key, True, 10), key)
        entry = json.loads(self.etcd.get(key))
        self.assertEqual((entry["role"], entry["tp_rank"], entry["lease_ttl_s"]),
                         ("decode", 0, TTL))
        self.assertGreaterEqual(entry["version"], 1)
        metrics = json.loads(self.etcd.get("/kvrail/v1/metrics/decode-0-" + self.session))
        self.assertEqual(metrics["url"], "http://%s/metrics" % self.decode_metrics)

    def test_2_a_room_lands_with_the_descriptor_from_the_registry(self):
        self.await_registry_read(self.session)
        self.assertEqual(self.landed(1), TransferPoll.SUCCESS)
        self.assertIn("descriptor of session %s taken from the registry" % self.session,
                      self.prefill_log_text())

    def test_3_a_killed_decode_expires_and_its_prefill_rooms_fail_naming_the_expiry(self):
        self.route(2, ready=False)  # pre-allocated at the prefill, never sent
        key = "/kvrail/v1/sessions/" + self.session
        self.decode.send_signal(signal.SIGKILL)
        took = self.etcd.await_key(key, False, TTL + 5)
        self.assertIsNotNone(took, "%s still there %d s after the kill" % (key, TTL + 5))
        print("registry entry gone %.2f s after SIGKILL (lease ttl %d s)" % (took, TTL),
              flush=True)
        failed = self.event(self.prefill_client, 2, (TransferPoll.FAILED,))
        self.assertIn("decode session %s's registry entry %s expired" % (self.session, key),
                      failed.reason)
        self.assertIn("(lease ttl %d s)" % TTL, failed.reason)


class BootstrapRestartTest(unittest.TestCase):
    """kvrail bootstrap --registry: the node description is published leased, the registrations
    are kept in etcd, and a bootstrap server killed and started again on the same port answers
    GET /route exactly as before."""

    def setUp(self):
        self.etcd = Etcd()
        self.processes = []
        with open("examples/decode_contract_tp1.json") as f:
            self.contract = f.read()

    def tearDown(self):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            process.stdout.close()
        self.etcd.stop()

    def start_bootstrap(self, port):
        process, line = started([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", str(port),
                                 "--registry", self.etcd.url, "--registry-ttl", str(TTL)],
                                "bootstrap ready")
        self.processes.append(process)
        return process, int(field(line, "port"))

    def get(self, port, target):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, target), timeout=5) as r:
            return r.status, r.read().decode()

    def answers(self, port):
        return [self.get(port, "/route?engine_rank=%d&target_dp_group=%d" % (rank, group))
                for rank, group in ((-1, -1), (0, 0), (0, 1))]

    def test_a_restarted_bootstrap_answers_get_route_as_before(self):
        bootstrap, port = self.start_bootstrap(0)
        for rank in range(2):
            body = json.dumps({"role": "Prefill", "world_size": 2, "dp_size": 2,
                               "rank_ip": "127.0.0.1", "rank_port": 7000 + rank,
                               "engine_rank": rank, "cache_layout": self.contract}).encode()
            request = urllib.request.Request("http://127.0.0.1:%d/route" % port, data=body,
                                             method="PUT")
            with urllib.request.urlopen(request, timeout=5) as r:
                self.assertEqual(r.status, 200)
        before = self.answers(port)
        node_key = "/kvrail/v1/nodes/127.0.0.1:%d" % port
        # Stored by the server's writer thread, after PUT /route answered.
        self.assertIsNotNone(self.etcd.await_true(
            lambda: json.loads(self.etcd.get(node_key) or "{}").get("prefill_dp_size") == 2, 10),
            self.etcd.get(node_key))
        self.assertIsNotNone(
            self.etcd.await_keys("/kvrail/v1/bootstrap/127.0.0.1:%d/" % port, 2, 10))
        bootstrap.send_signal(signal.SIGKILL)
        bootstrap.wait()
        self.assertIsNotNone(self.etcd.await_key(node_key, False, TTL + 5))
        _, again = self.start_bootstrap(port)
        self.assertEqual(again, port)
        self.assertEqual(self.answers(port), before)
        self.assertIsNotNone(self.etcd.await_key(node_key, True, 10))


class RegistryRefusedTest(unittest.TestCase):
    """A registry that is down at start, or a --registry that is not one, is a start error in
    one line naming it."""

    def run_sidecar(self, registry):
        return subprocess.run([KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint",
                               "ipc:///tmp/kvrail-registry-%s-x.sock" % TAG, "--tls", "tcp",
                               "--registry", registry], capture_output=True, text=True,
                              timeout=30)

    def test_etcd_down_at_start_is_a_start_error_naming_it(self):
        from etcd import free_port
        endpoint = "127.0.0.1:%d" % free_port()
        done = self.run_sidecar("etcd://" + endpoint)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("etcd at %s: GET /health" % endpoint, done.stderr)

    def test_a_registry_that_is_not_etcd_is_refused_naming_the_rule(self):
        done = self.run_sidecar("http://127.0.0.1:2379")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("--registry http://127.0.0.1:2379: the scheme must be etcd://", done.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
