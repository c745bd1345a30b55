#!/usr/bin/python3
"""The Python engine client (python/kvrail_engine) against a real `kvrail sidecar` process."""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))

from kvrail_engine import SidecarClient, SidecarError, TransferPoll  # noqa: E402

KVRAIL = os.path.join(os.getcwd(), "tools", "kvrail")
CONTRACT = open("examples/decode_contract_tp1.json").read()
MANIFEST = open("examples/manifest.json").read()


class EngineClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.endpoint = "ipc:///tmp/kvrail-pytest-%d.sock" % os.getpid()
        cls.sidecar = subprocess.Popen(
            [KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint", cls.endpoint,
             "--tls", "tcp"], stdout=subprocess.PIPE, text=True)
        line = cls.sidecar.stdout.readline()
        assert line.startswith("sidecar ready"), line
        cls.shm = "/kvrail-pytest-%d" % os.getpid()
        with open("/dev/shm" + cls.shm, "wb") as f:
            f.truncate(1 << 20)
        os.chmod("/dev/shm" + cls.shm, 0o600)
        cls.client = SidecarClient(cls.endpoint, timeout=10.0)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.sidecar.terminate()
        cls.assert_exit = cls.sidecar.wait(timeout=10)
        os.unlink("/dev/shm" + cls.shm)

    def test_1_attach_then_requests(self):
        self.client.attach_shm(self.shm, CONTRACT)
        # A second attach is refused, naming the rule.
        with self.assertRaisesRegex(SidecarError, "attached already"):
            self.client.attach_shm(self.shm, CONTRACT)

    def test_2_unknown_rooms_poll_failed_with_a_reason(self):
        states = self.client.poll([41, 42])
        self.assertEqual(states[42], (TransferPoll.FAILED, "unknown room"))

    def test_3_bad_input_is_refused_naming_the_input(self):
        with self.assertRaisesRegex(SidecarError, "destination manifest"):
            self.client.expect(7, "127.0.0.1:1", "{not json")
        with self.assertRaisesRegex(SidecarError, "bootstrap address"):
            self.client.expect(7, "no-port", MANIFEST)
        with self.assertRaisesRegex(SidecarError, "decode sidecar"):
            self.client.ready(7, MANIFEST, bootstrap_token=1)

    def test_4_a_room_whose_prefill_is_unreachable_fails_with_an_event(self):
        # Nothing listens at this bootstrap address: the route fails and the room with it.
        self.client.expect(9, "127.0.0.1:1", MANIFEST)
        event = self.client.next_event(timeout=30)
        self.assertIsNotNone(event)
        self.assertEqual(event.room, 9)
        self.assertEqual(event.status, TransferPoll.FAILED)
        self.assertIn("127.0.0.1:1", event.reason)
        self.assertEqual(self.client.poll([9])[9][0], TransferPoll.FAILED)


if __name__ == "__main__":
    unittest.main(verbosity=2)
