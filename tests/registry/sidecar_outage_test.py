#!/usr/bin/python3
"""kvrail sidecar --registry with etcd killed mid-run (issue 16): the registry is never the only
path. The prefill keeps landing rooms for the decode whose descriptor it took from the registry
(cached), and lands rooms for a decode it never saw there through the peer-to-peer handshake."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "registry"))

from etcd import Etcd  # noqa: E402
from kvrail_engine import SidecarClient, TransferPoll  # noqa: E402
from registry_test import (KVRAIL, TAG, TMP, Rooms, field, start_node, started,  # noqa: E402
                           stop_all)


class SidecarEtcdLostTest(Rooms, unittest.TestCase):
    def setUp(self):
        self.processes = []
        self.clients = []
        self.etcd = Etcd()
        self.addCleanup(self.cleanup)
        start_node(self)
        self.prefill_log_path = os.path.join(TMP, "outage-prefill-%s.log" % TAG)
        self.prefill_log = open(self.prefill_log_path, "w")
        self.prefill_client, _ = self.sidecar(
            "prefill", ["--bootstrap", self.bootstrap, "--registry", self.etcd.url],
            stderr=self.prefill_log)

    def cleanup(self):
        stop_all(self)
        self.prefill_log.close()
        self.etcd.stop()

    def sidecar(self, role, flags, stderr=None):
        """A sidecar with an attached arena: its engine client and its ready line's session."""
        endpoint = "ipc:///tmp/kvrail-outage-%s-%d.sock" % (TAG, len(self.processes))
        process, line = started([KVRAIL, "sidecar", "--role", role, "--engine-endpoint",
                                 endpoint, "--host", "127.0.0.1", "--tls", "tcp"] + flags,
                                "sidecar ready", stderr=stderr)
        self.processes.append(process)
        client = SidecarClient(endpoint, timeout=10.0)
        self.clients.append(client)
        client.attach_allocated(self.arena_bytes, self.contract)
        return client, field(line, "session")

    def test_rooms_keep_landing_after_etcd_dies(self):
        self.decode_client, known = self.sidecar("decode", ["--registry", self.etcd.url])
        self.assertIsNotNone(self.etcd.await_key("/kvrail/v1/sessions/" + known, True, 10))
        self.await_registry_read(known)
        self.assertEqual(self.landed(1), TransferPoll.SUCCESS)
        taken = "descriptor of session %s taken from the registry"
        self.assertIn(taken % known, self.prefill_log_text())

        self.etcd.stop()  # SIGKILL: the watch and every lease renewal fail from here on
        self.assertEqual(self.landed(2), TransferPoll.SUCCESS)

        self.decode_client, unseen = self.sidecar("decode", [])  # a session etcd never had
        self.assertEqual(self.landed(3), TransferPoll.SUCCESS)
        self.assertNotIn(taken % unseen, self.prefill_log_text())


if __name__ == "__main__":
    unittest.main(verbosity=2)
