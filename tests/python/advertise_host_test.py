#!/usr/bin/python3
"""A room lands between a prefill and a decode sidecar that bind every interface (--host
0.0.0.0) and advertise an address of lo (--advertise-host 127.0.0.7), beside a real bootstrap
server, driven through the Python engine client. Each ready line names the CachePD endpoint and
session that peers are told (127.0.0.7), never the wildcard the sockets are bound to; and Stats
names each sidecar's role, rank and pid, its arena and its data plane's endpoints and regions."""

import os
import random
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "python"))

from kvrail_engine import SidecarClient, TransferPoll  # noqa: E402
from processes import await_event, field, started, stop  # noqa: E402

TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))
KVRAIL = os.path.join(os.getcwd(), "tools", "kvrail")
SHAPE = ["--layers", "2", "--pages", "64"]
ADVERTISED = "127.0.0.7"


class AdvertiseHostTest(unittest.TestCase):
    def setUp(self):
        self.processes = []
        self.clients = []

    def tearDown(self):
        for client in self.clients:
            client.close()
        stop(self.processes)

    def start(self, argv, ready):
        process, line = started(argv, ready)
        self.processes.append(process)
        return line

    def client(self, endpoint, contract, arena_bytes):
        client = SidecarClient(endpoint, timeout=10.0)
        self.clients.append(client)
        client.attach_allocated(arena_bytes, contract)
        return client

    def test_a_room_lands_between_sidecars_that_advertise_another_address_than_they_bind(self):
        line = self.start([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", "0"],
                          "bootstrap ready")
        bootstrap = "127.0.0.1:%s" % field(line, "port")
        contract = subprocess.check_output([KVRAIL, "contract", "--tp", "1"] + SHAPE, text=True)
        arena_bytes = int(subprocess.check_output(
            [KVRAIL, "contract", "--tp", "1", "--arena-bytes"] + SHAPE, text=True))
        common = ["--host", "0.0.0.0", "--advertise-host", ADVERTISED, "--tls", "tcp",
                  "--lanes", "2"]
        endpoints = {}
        for role in ("prefill", "decode"):
            endpoints[role] = "ipc:///tmp/kvrail-advertise-%s-%s.sock" % (TAG, role)
            extra = ["--bootstrap", bootstrap] if role == "prefill" else []
            line = self.start([KVRAIL, "sidecar", "--role", role, "--engine-endpoint",
                               endpoints[role]] + extra + common, "sidecar ready")
            # Peers are told the advertised address: the ready line says so too.
            self.assertRegex(field(line, "cachepd"), r"^tcp://127\.0\.0\.7:[0-9]+$", line)
            if role == "decode":
                self.assertRegex(field(line, "session"), r"^127\.0\.0\.7:[0-9]+$", line)
        prefill = self.client(endpoints["prefill"], contract, arena_bytes)
        decode = self.client(endpoints["decode"], contract, arena_bytes)

        prefill.begin(1)
        decode.expect(1, bootstrap, block_tables=[[1, 2]], window=(0, 32))
        await_event(prefill, 1, (TransferPoll.BOOTSTRAPPED,))
        prefill.ready(1, bootstrap_token=7, block_tables=[[1, 2]], window=(0, 32))
        landed = await_event(decode, 1, (TransferPoll.SUCCESS, TransferPoll.FAILED))
        self.assertEqual(landed.status, TransferPoll.SUCCESS, landed.reason)
        self.assertEqual(await_event(prefill, 1, (TransferPoll.SUCCESS, TransferPoll.FAILED))
                         .status, TransferPoll.SUCCESS)

        # Stats says who answers, and what its arena and data plane hold now.
        for role, client, process, peers in (("prefill", prefill, self.processes[1], 1),
                                             ("decode", decode, self.processes[2], 0)):
            stats = client.stats()
            self.assertEqual((stats["role"], stats["tp_rank"], stats["tp_size"], stats["pid"]),
                             (role, 0, 1, process.pid))
            self.assertGreaterEqual(stats["arena_bytes"], arena_bytes)
            self.assertEqual(stats["layers"], 2)  # the contract's layer.0.* and layer.1.*
            self.assertEqual((stats["data_plane_peers"], stats["regions"]), (peers, 1))
            self.assertEqual(stats["endpoints"], 2 * peers)  # one per lane (--lanes 2)


if __name__ == "__main__":
    unittest.main()
