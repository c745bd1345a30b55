#!/usr/bin/python3
"""The Python engine client (python/kvrail_engine) against a real `kvrail sidecar` process."""

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
import unittest
import urllib.request

import zmq

# Names in /dev/shm and /tmp are host-wide; sandboxes in other pid namespaces often share our pid.
TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))

sys.path.insert(0, os.path.join(os.getcwd(), "python"))

from kvrail_engine import (Pages, SidecarArena, SidecarClient, SidecarError,  # noqa: E402
                           TransferPoll)
from kvrail_engine.__main__ import state_line  # noqa: E402
from kvrail_engine.client import engine_pb2  # noqa: E402

KVRAIL = os.path.join(os.getcwd(), "tools", "kvrail")
CONTRACT = open("examples/decode_contract_tp1.json").read()
MANIFEST = open("examples/manifest.json").read()


def start_decode_sidecar(endpoint, tls, extra=()):
    sidecar = subprocess.Popen(
        [KVRAIL, "sidecar", "--role", "decode", "--engine-endpoint", endpoint, "--tls", tls]
        + list(extra), stdout=subprocess.PIPE, text=True)
    line = sidecar.stdout.readline()
    assert line.startswith("sidecar ready"), line
    return sidecar


class EngineClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.endpoint = "ipc:///tmp/kvrail-pytest-%s.sock" % TAG
        cls.sidecar = start_decode_sidecar(cls.endpoint, "tcp")
        cls.shm = "/kvrail-pytest-%s" % TAG
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
        token = self.client.engine_token
        self.assertEqual(len(token), 32)
        # Another arena is refused, naming the rule; the same one again is a restarted
        # engine's reattach.
        with self.assertRaisesRegex(SidecarError, "attached already"):
            self.client.attach_allocated(2 << 20, CONTRACT)
        self.client.attach_shm(self.shm, CONTRACT)
        # Another client takes over from a connected engine only with its token.
        other = SidecarClient(self.endpoint, timeout=10.0)
        try:
            with self.assertRaisesRegex(SidecarError, "only with the engine token"):
                other.attach_shm(self.shm, CONTRACT)
            other.attach_shm(self.shm, CONTRACT, engine_token=token)
        finally:
            other.close()
        self.client.attach_shm(self.shm, CONTRACT, engine_token=token)  # and back

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
        with self.assertRaisesRegex(SidecarError, "LayersReady room 7: this is a decode sidecar"):
            self.client.layers_ready(7, 1, MANIFEST)
        with self.assertRaisesRegex(SidecarError, "Begin room 7: this is a decode sidecar"):
            self.client.begin(7)

    def test_4_a_room_whose_prefill_is_unreachable_fails_with_an_event(self):
        # Nothing listens at this bootstrap address: the route fails and the room with it.
        self.client.expect(9, "127.0.0.1:1", MANIFEST)
        event = self.client.next_event(timeout=30)
        self.assertIsNotNone(event)
        self.assertEqual(event.room, 9)
        self.assertEqual(event.status, TransferPoll.FAILED)
        self.assertIn("127.0.0.1:1", event.reason)
        self.assertEqual(event.cause, "bootstrap")  # for code: nobody answers at that address
        self.assertEqual(self.client.poll([9])[9][0], TransferPoll.FAILED)
        self.assertEqual(self.client.poll_states([9])[9].cause, "bootstrap")

    def test_5_drain_events_takes_what_arrived_and_never_waits(self):
        self.assertEqual(self.client.drain_events(), [])
        self.assertIsNone(self.client.next_event(timeout=0))
        self.client.expect(11, "127.0.0.1:1", MANIFEST)
        self.client.expect(12, "127.0.0.1:1", MANIFEST)
        # A scheduler loop: poll every room in flight in one round trip, drain, go on.
        seen = {}
        for _ in range(3000):
            states = self.client.poll_states([11, 12, 13])
            self.assertEqual(states[13].reason, "unknown room")
            for event in self.client.drain_events():
                seen[event.room] = event
            if len(seen) == 2:
                break
            time.sleep(0.01)
        self.assertEqual(sorted(seen), [11, 12])
        self.assertEqual(seen[11].status, TransferPoll.FAILED)
        self.assertEqual(self.client.drain_events(), [])
        state = self.client.poll_states([11])[11]
        self.assertEqual(state.status, TransferPoll.FAILED)
        self.assertIn("127.0.0.1:1", state.reason)
        self.assertEqual((state.bootstrap_token, state.speculative_ids), (-1, ()))


def start_bootstrap():
    bootstrap = subprocess.Popen([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", "0"],
                                 stdout=subprocess.PIPE, text=True)
    line = bootstrap.stdout.readline()
    assert line.startswith("bootstrap ready"), line
    port = int(line.split("port=")[1].split()[0])
    return bootstrap, port


def register_prefill_rank(port, engine_rank, world_size, dp_size, rank_port=1):
    """One prefill rank's registration (CACHEPD section 2.1), as a tokenspeed rank sends it."""
    body = json.dumps({"role": "Prefill", "world_size": world_size, "dp_size": dp_size,
                       "rank_ip": "127.0.0.1", "rank_port": rank_port, "engine_rank": engine_rank,
                       "cache_layout": CONTRACT}).encode()  # a TP-1 rank like the decode
    request = urllib.request.Request("http://127.0.0.1:%d/route" % port, data=body, method="PUT")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200, response.status


class DpGroupTest(unittest.TestCase):
    """Expect.dp_group against a prefill node of two DP groups: CachePD routes room r to group
    r mod 2 (section 1.3, D4); another group named by the engine fails the room, naming both."""

    @classmethod
    def setUpClass(cls):
        cls.bootstrap, port = start_bootstrap()
        for rank in range(2):
            register_prefill_rank(port, rank, world_size=2, dp_size=2)
        cls.address = "127.0.0.1:%d" % port
        cls.endpoint = "ipc:///tmp/kvrail-pytest-dp-%s.sock" % TAG
        cls.sidecar = start_decode_sidecar(cls.endpoint, "tcp")
        cls.shm = "/kvrail-pytest-dp-%s" % TAG
        with open("/dev/shm" + cls.shm, "wb") as f:
            f.truncate(1 << 20)
        cls.client = SidecarClient(cls.endpoint, timeout=10.0)
        cls.client.attach_shm(cls.shm, CONTRACT)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.sidecar.terminate()
        cls.sidecar.wait(timeout=10)
        cls.bootstrap.terminate()
        cls.bootstrap.wait(timeout=10)
        os.unlink("/dev/shm" + cls.shm)

    def failure_of(self, room):
        event = self.client.next_event(timeout=30)
        self.assertIsNotNone(event)
        self.assertEqual(event.room, room)
        self.assertEqual(event.status, TransferPoll.FAILED)
        return event.reason

    def test_1_another_group_fails_the_room_naming_both(self):
        self.client.expect(5, self.address, MANIFEST, dp_group=0)
        self.assertIn("Expect.dp_group 0 is not where CachePD routes room 5: room mod "
                      "prefill_dp_size (2) = 1", self.failure_of(5))
        # Now that the node is known, the check runs at once, with the same words.
        self.client.expect(7, self.address, MANIFEST, dp_group=0)
        self.assertIn("room mod prefill_dp_size (2) = 1", self.failure_of(7))

    def test_2_a_group_the_node_does_not_have_is_named(self):
        self.client.expect(4, self.address, MANIFEST, dp_group=2)
        self.assertIn("Expect.dp_group 2: the prefill node has 2 DP group(s)", self.failure_of(4))
        with self.assertRaisesRegex(SidecarError, "dp_group -1 is not a DP group"):
            self.client.expect(6, self.address, MANIFEST, dp_group=-1)


class StatusFramesTest(unittest.TestCase):
    """A decode room whose prefill rank (a PULL socket here) answers in the 2026-09 form
    (CACHEPD 12.9): the Success event, poll_states and `python3 -m kvrail_engine poll` carry
    its cached tokens and first token logprob."""

    @classmethod
    def setUpClass(cls):
        cls.bootstrap, port = start_bootstrap()
        cls.prefill = zmq.Context.instance().socket(zmq.PULL)
        cls.prefill.setsockopt(zmq.LINGER, 0)
        cls.prefill.setsockopt(zmq.RCVTIMEO, 20000)
        register_prefill_rank(port, 0, world_size=1, dp_size=1,
                              rank_port=cls.prefill.bind_to_random_port("tcp://127.0.0.1"))
        cls.address = "127.0.0.1:%d" % port
        cls.endpoint = "ipc:///tmp/kvrail-pytest-status-%s.sock" % TAG
        # The fake prefill stands in for a tokenspeed rank, which proves nothing.
        cls.sidecar = start_decode_sidecar(cls.endpoint, "tcp", ["--sender-proofs", "off"])
        cls.shm = "/kvrail-pytest-status-%s" % TAG
        with open("/dev/shm" + cls.shm, "wb") as f:
            f.truncate(1 << 20)
        cls.client = SidecarClient(cls.endpoint, timeout=10.0)
        cls.client.attach_shm(cls.shm, CONTRACT)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.sidecar.terminate()
        cls.sidecar.wait(timeout=10)
        cls.bootstrap.terminate()
        cls.bootstrap.wait(timeout=10)
        cls.prefill.close()
        os.unlink("/dev/shm" + cls.shm)

    def reply_route(self):
        """The decode's PULL socket, from its registration (CACHEPD 3.2: frames 1 and 2)."""
        while True:
            frames = self.prefill.recv_multipart()
            if len(frames) == 8 and frames[0] == b"None":
                return "tcp://%s:%s" % (frames[1].decode(), frames[2].decode())

    def test_a_success_carries_the_cached_tokens_and_the_logprob(self):
        self.client.expect(3, self.address, MANIFEST)
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        push.connect(self.reply_route())
        push.send_multipart([b"3", b"5", b"0", b"7919", b"", b"96", struct.pack("<d", -0.125)])
        push.close()
        event = self.client.next_event(timeout=30)
        self.assertIsNotNone(event)
        self.assertEqual((event.room, event.status), (3, TransferPoll.SUCCESS), event.reason)
        self.assertEqual(event.bootstrap_token, 7919)
        self.assertEqual(event.cached_tokens, 96)
        self.assertEqual(event.first_token_logprob, -0.125)
        state = self.client.poll_states([3])[3]
        self.assertEqual((state.cached_tokens, state.first_token_logprob), (96, -0.125))

        # What `python3 -m kvrail_engine poll` prints of it.
        self.assertEqual(state_line(3, state), "room 3 SUCCESS bootstrap_token=7919 "
                                               "cached_tokens=96 first_token_logprob=-0.125")


class SidecarLossTest(unittest.TestCase):
    """The client notices its sidecar die or stop, tells the engine every open room failed and
    what it may do with the pages (python/kvrail_engine/liveness.py), and the engine reattaches
    to a restarted sidecar. Rooms stay in flight: their prefill rank is a PULL socket that never
    answers."""

    @classmethod
    def setUpClass(cls):
        cls.bootstrap, port = start_bootstrap()
        cls.silent = zmq.Context.instance().socket(zmq.PULL)
        cls.silent.setsockopt(zmq.LINGER, 0)
        register_prefill_rank(port, 0, world_size=1, dp_size=1,
                              rank_port=cls.silent.bind_to_random_port("tcp://127.0.0.1"))
        cls.address = "127.0.0.1:%d" % port
        cls.shm = "/kvrail-pytest-loss-%s" % TAG
        with open("/dev/shm" + cls.shm, "wb") as f:
            f.truncate(1 << 20)

    @classmethod
    def tearDownClass(cls):
        cls.bootstrap.terminate()
        cls.bootstrap.wait(timeout=10)
        cls.silent.close()
        os.unlink("/dev/shm" + cls.shm)

    def setUp(self):
        self.endpoint = "ipc:///tmp/kvrail-pytest-loss-%s-%s.sock" % (TAG, self._testMethodName[-6:])
        self.sidecars = []
        self.client = SidecarClient(self.endpoint, timeout=10.0, heartbeat=0.2,
                                    heartbeat_timeout=1.0)

    def tearDown(self):
        self.client.close()
        for sidecar in self.sidecars:
            if sidecar.poll() is None:
                os.kill(sidecar.pid, signal.SIGCONT)
                sidecar.kill()
            sidecar.wait(timeout=10)

    def start_sidecar(self):
        sidecar = start_decode_sidecar(self.endpoint, "tcp", ["--fence-wait", "1"])
        self.sidecars.append(sidecar)
        return sidecar

    def events_until(self, count, seconds=20):
        events = []
        deadline = time.monotonic() + seconds
        while len(events) < count and time.monotonic() < deadline:
            events.extend(self.client.drain_events())
            time.sleep(0.02)
        return events

    def test_a_killed_sidecar_fails_every_room_with_its_pages_free_and_a_new_one_is_attached(self):
        sidecar = self.start_sidecar()
        self.client.attach_shm(self.shm, CONTRACT)
        self.assertEqual(self.client.sidecar_pid, sidecar.pid)
        for room in (1, 2):
            self.client.expect(room, self.address, MANIFEST)
        os.kill(sidecar.pid, signal.SIGKILL)
        sidecar.wait(timeout=10)
        events = self.events_until(2)
        self.assertEqual(sorted(e.room for e in events), [1, 2])
        for e in events:
            self.assertEqual((e.status, e.pages), (TransferPoll.FAILED, Pages.REUSABLE))
            self.assertIn("the sidecar is lost", e.reason)
            self.assertIn("the sidecar process is gone", e.reason)
            self.assertIn("process %d is gone" % sidecar.pid, e.reason)
            self.assertEqual(e.cause, "sidecar_lost")
        self.assertIsNotNone(self.client.sidecar_lost)
        with self.assertRaisesRegex(SidecarError, "the sidecar is lost"):
            self.client.poll([1])
        # A restarted sidecar: the engine attaches again; the old rooms are unknown there.
        self.start_sidecar()
        deadline = time.monotonic() + 20
        while self.client.sidecar_lost is not None and time.monotonic() < deadline:
            self.client.drain_events()
            time.sleep(0.02)
        self.assertIsNone(self.client.sidecar_lost)
        self.client.attach_shm(self.shm, CONTRACT)
        self.assertEqual(self.client.poll([1])[1], (TransferPoll.FAILED, "unknown room"))

    def test_a_stopped_sidecar_holds_the_pages_until_it_is_back_and_ends_the_room(self):
        sidecar = self.start_sidecar()
        self.client.attach_shm(self.shm, CONTRACT)
        self.client.expect(3, self.address, MANIFEST)
        os.kill(sidecar.pid, signal.SIGSTOP)
        events = self.events_until(1)
        self.assertEqual([(e.room, e.status, e.pages) for e in events],
                         [(3, TransferPoll.FAILED, Pages.HELD)])
        self.assertIn("may still land", events[0].reason)
        self.assertIn("process %d still runs" % sidecar.pid, events[0].reason)
        self.assertEqual(events[0].cause, "sidecar_lost")
        # Back: the client attaches again, which voids the room there; the sidecar fences it
        # (its prefill rank never answers: released unproven after --fence-wait 1) and the pages
        # come free.
        os.kill(sidecar.pid, signal.SIGCONT)
        released = self.events_until(1, seconds=30)
        self.assertEqual([(e.room, e.status, e.pages_released) for e in released],
                         [(3, TransferPoll.PAGES_RELEASED, True)])
        self.assertIsNone(self.client.sidecar_lost)


class AllocatedArenaTest(unittest.TestCase):
    """AttachArena with allocate_bytes: the sidecar (over UCX shared memory) allocates the arena
    and the engine maps it from the reply's /proc path."""

    @classmethod
    def setUpClass(cls):
        cls.endpoint = "ipc:///tmp/kvrail-pytest-alloc-%s.sock" % TAG
        cls.sidecar = start_decode_sidecar(cls.endpoint, "sm")
        cls.client = SidecarClient(cls.endpoint, timeout=10.0)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.sidecar.terminate()
        cls.sidecar.wait(timeout=10)

    def test_1_too_few_bytes_are_refused_naming_both_sizes(self):
        with self.assertRaisesRegex(SidecarError, r"allocate_bytes is 64, less than the \d+ bytes"):
            self.client.attach_allocated(64, CONTRACT)

    def test_2_an_arena_named_twice_is_refused_naming_both_fields(self):
        # The client never sends this; an engine speaking the protocol directly might.
        request = engine_pb2.EngineRequest()
        request.attach.shm_name = "/kvrail-never-made"
        request.attach.allocate_bytes = 1 << 20
        request.attach.contract = CONTRACT
        with self.assertRaisesRegex(SidecarError, "got shm_name and allocate_bytes"):
            self.client._call(request)

    def test_3_the_allocated_arena_is_mapped_here_zero_filled_and_shared(self):
        with self.client.attach_allocated(1 << 20, CONTRACT) as arena:
            self.assertEqual(arena.placement, "ucx-shm")
            self.assertTrue(arena.path.startswith("/proc/%d/fd/" % self.sidecar.pid), arena.path)
            self.assertEqual(len(arena.view), 1 << 20)
            self.assertEqual(bytes(arena.view[:4096]), bytes(4096))
            arena.view[0:4] = b"kvrl"
            # A second mapping of the same path sees the engine's bytes: the pages are shared.
            with SidecarArena(arena.path, arena.offset, 4, arena.placement) as again:
                self.assertEqual(bytes(again.view), b"kvrl")
        with self.assertRaisesRegex(SidecarError, "attached already"):
            self.client.attach_allocated(2 << 20, CONTRACT)


if __name__ == "__main__":
    unittest.main(verbosity=2)
