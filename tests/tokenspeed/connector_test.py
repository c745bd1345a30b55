#!/usr/bin/python3
"""kvrail_tokenspeed's executors against fakes shaped like tokenspeed's interfaces and the
kvrail_engine client (no torch, no tokenspeed, no processes): what each tokenspeed call becomes
on the sidecar, what the scheduler is told, and when."""

import argparse
import enum
import os
import signal
import sys
import tempfile
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.getcwd(), "python"))

from fakes import (PD, FakeClient, FakeSidecar, Forward, Info, StepCounter,  # noqa: E402
                   bootstrapped, event, failed, manifest, released)
from kvrail_engine import Pages, TransferPoll  # noqa: E402
from kvrail_tokenspeed import arena, hook, settings  # noqa: E402
from kvrail_tokenspeed.decode import DecodeConnector  # noqa: E402
from kvrail_tokenspeed.launcher import LaunchError, Supervised  # noqa: E402
from kvrail_tokenspeed.prefill import PrefillConnector, layers_final  # noqa: E402
from kvrail_tokenspeed.vote import Agreed, Local, agree, alone  # noqa: E402

TABLES = {"full_attention": [[1, 2, 3, 4]]}
STEPS = (("layer.0.k", "layer.0.v"), ("layer.1.k", "layer.1.v"), ("layer.2.k",))


def prefill(client, **kwargs):
    kwargs.setdefault("reduce", alone)
    return PrefillConnector(client=client, events=PD, manifest=manifest, **kwargs)


def decode(client, **kwargs):
    kwargs.setdefault("reduce", alone)
    return DecodeConnector(client=client, events=PD, manifest=manifest, **kwargs)


def extend(request_id, begin, length, prompt_len, tables=TABLES):
    return Forward.Batch([request_id], 1, extend_prefix_lens=[begin], input_lengths=[length],
                         prefill_lengths=[prompt_len], request_pool_indices=[5],
                         block_tables=tables)


def expecting(room):
    """A decode executor with request "r1" (room `room`) bootstrapped and expected."""
    client = FakeClient()
    executor = decode(client)
    executor.register("r1", Info(room))
    executor.generate_events()
    executor.execute(extend("r1", 0, 50, 50))
    return client, executor


def after_forward(request_id):
    return Forward.Batch([request_id], 0, block_tables=TABLES)


class PrefillTest(unittest.TestCase):
    def test_a_room_goes_begin_bootstrapped_ready_success(self):
        client = FakeClient()
        executor = prefill(client)
        executor.register("r1", Info(7))
        self.assertEqual(client.named("begin"), [("begin", 7, {})])
        self.assertEqual(executor.generate_events(), [])  # held until every decode is in
        client.events.append(bootstrapped(7, (16, 50), (16, 50)))
        self.assertEqual(executor.generate_events(), [PD.BootstrappedEvent("r1")])
        executor.prepare_prefill(extend("r1", 16, 34, 50))
        executor.store_prefill_token("r1", 0, 42, [3, 4])
        executor.execute(after_forward("r1"))
        (_, room, ready), = client.named("ready")
        self.assertEqual(room, 7)
        self.assertEqual(ready["bootstrap_token"], 42)
        self.assertEqual(ready["speculative_ids"], [3, 4])
        self.assertEqual(ready["cached_tokens"], 16)  # the prefill's own prefix
        self.assertIn(b'"block_ids": [2, 3, 4]', ready["source_manifest"])
        self.assertEqual(executor.generate_events(), [])
        client.events.append(event(7, TransferPoll.SUCCESS))
        self.assertEqual(executor.generate_events(), [PD.SucceededEvent("r1")])
        self.assertEqual(executor.requests, {})

    def test_an_idle_rank_readies_its_token_only(self):
        client = FakeClient()
        executor = prefill(client)
        executor.register("r1", Info(7))
        client.events.append(bootstrapped(7))  # CachePD's dummy: no decode reads this rank
        self.assertEqual(executor.generate_events(), [PD.BootstrappedEvent("r1")])
        executor.prepare_prefill(extend("r1", 0, 40, 40))
        executor.store_prefill_token("r1", 0, 42)
        executor.execute(after_forward("r1"))
        (_, room, ready), = client.named("ready")
        self.assertEqual((room, ready["source_manifest"], ready["bootstrap_token"]), (7, b"", 42))

    def test_a_room_of_another_dp_group_fails_without_begin(self):
        client = FakeClient()
        executor = prefill(client, dp_size=2, dp_rank=0)
        executor.register("r1", Info(7))
        self.assertEqual(client.calls, [])
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])

    def test_decode_windows_that_disagree_abort_the_room(self):
        client = FakeClient()
        executor = prefill(client)
        executor.register("r1", Info(3))
        client.events.append(bootstrapped(3, (0, 40), (16, 40)))
        self.assertEqual(executor.generate_events(), [])  # aborted, not yet fenced
        self.assertEqual([c[0] for c in client.calls], ["begin", "abort"])
        client.events.append(failed(3))
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])

    def test_bad_input_names_the_input_and_the_rule(self):
        executor = prefill(FakeClient())
        with self.assertRaisesRegex(ValueError, "bootstrap_room -1 is not a room id"):
            executor.register("r1", Info(-1))
        executor.register("r1", Info(1))
        with self.assertRaisesRegex(ValueError, "request r1 is registered already"):
            executor.register("r1", Info(2))
        with self.assertRaisesRegex(ValueError, "room 1 is request r1's"):
            executor.register("r2", Info(1))
        with self.assertRaisesRegex(ValueError, "the bootstrap token -3 must be an int >= 0"):
            executor.store_prefill_token("r1", 0, -3)

    def test_a_refused_ready_fails_the_room_through_an_abort(self):
        client = FakeClient()
        executor = prefill(client)
        executor.register("r1", Info(9))
        client.events.append(bootstrapped(9, (0, 20)))
        executor.generate_events()
        client.refuse.add("ready")
        executor.store_prefill_token("r1", 0, 1)
        executor.execute(after_forward("r1"))
        self.assertEqual(executor.generate_events(), [])
        self.assertEqual(client.named("abort")[0][1], 9)
        client.events.append(failed(9))
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])

    def test_an_engine_abort_is_fenced_before_the_failed_event(self):
        client = FakeClient()
        executor = prefill(client)
        executor.register("r1", Info(4))
        executor.abort("r1", Info(4), "client cancelled")
        self.assertEqual(client.named("abort")[0][2]["reason"], "client cancelled")
        self.assertEqual(executor.generate_events(), [])
        client.events.append(failed(4))
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])

    def test_an_abort_of_a_request_never_registered_begins_and_aborts_its_room(self):
        client = FakeClient()
        executor = prefill(client)
        executor.abort("epd", Info(11), "embedding receive timed out")
        self.assertEqual([(c[0], c[1]) for c in client.calls], [("begin", 11), ("abort", 11)])
        client.events.append(failed(11))
        self.assertEqual(executor.generate_events(), [])  # the scheduler never knew it
        self.assertEqual(executor.detached, {})


class LayerwiseTest(unittest.TestCase):
    def setUp(self):
        self.client = FakeClient()
        self.executor = prefill(self.client, producer_steps=STEPS)
        self.counter = StepCounter()
        self.executor.register("r1", Info(5))
        self.client.events.append(bootstrapped(5, (0, 50)))
        self.executor.generate_events()

    def test_layers_final_after_each_producer_step(self):
        self.assertEqual(layers_final(STEPS), [0, 1, 2, 3])
        with self.assertRaisesRegex(ValueError, "'kv' is not layer.<N>.<suffix>"):
            layers_final((("kv",),))

    def test_each_finished_layer_is_said_final_then_ready_sends_the_rest(self):
        self.executor.register_layerwise_step_counter(self.counter, 1)
        self.executor.prepare_prefill(extend("r1", 0, 32, 50))  # not the last chunk
        self.counter.ready = 3
        self.executor.generate_events()
        self.assertEqual(self.client.named("layers_ready"), [])
        self.executor.prepare_prefill(extend("r1", 32, 18, 50))  # the last: steps 3..5
        self.counter.record_cache()
        self.executor.generate_events()
        self.counter.record_cache()
        self.executor.store_prefill_token("r1", 0, 8)
        layers = self.client.named("layers_ready")
        self.assertEqual([c[2]["layers"] for c in layers], [1, 2])
        self.assertIn(b'"block_ids": [1, 2, 3, 4]', layers[0][2]["source_manifest"])
        self.assertEqual(layers[1][2]["source_manifest"], b"")  # only the first carries it
        self.executor.execute(after_forward("r1"))
        self.assertEqual(self.client.named("ready")[0][2]["source_manifest"], b"")

    def test_the_watcher_says_layers_final_while_the_forward_runs(self):
        self.executor.register_layerwise_step_counter(self.counter, 1)
        self.executor.prepare_prefill(extend("r1", 0, 50, 50))
        self.counter.record_cache()  # the forward finished layer 0; no executor call since
        deadline = time.monotonic() + 5
        while not self.client.named("layers_ready") and time.monotonic() < deadline:
            time.sleep(0.001)
        self.assertEqual(self.client.named("layers_ready")[0][2]["layers"], 1)
        self.executor.close()
        self.assertFalse(self.executor.watcher._thread.is_alive())

    def test_an_interval_says_layers_final_in_its_steps(self):
        self.executor.register_layerwise_step_counter(self.counter, 2)
        self.executor.prepare_prefill(extend("r1", 0, 50, 50))
        self.counter.ready = 1
        self.executor.generate_events()
        self.assertEqual(self.client.named("layers_ready"), [])
        self.counter.ready = 2
        self.executor.generate_events()
        self.counter.ready = 3  # the last step: every layer, whatever the interval
        self.executor.generate_events()
        self.assertEqual([c[2]["layers"] for c in self.client.named("layers_ready")], [2, 3])

    def test_without_a_schedule_layerwise_is_refused(self):
        executor = prefill(FakeClient())
        with self.assertRaisesRegex(ValueError, "needs the cache producer schedule"):
            executor.register_layerwise_step_counter(self.counter, 1)


class DecodeTest(unittest.TestCase):
    def test_a_room_goes_bootstrapped_expect_remote_prefill_done(self):
        client = FakeClient()
        executor = decode(client)
        executor.register("r1", Info(6))
        self.assertEqual(executor.generate_events(), [PD.BootstrappedEvent("r1")])
        executor.execute(extend("r1", 16, 34, 50))
        (_, room, expect), = client.named("expect")
        self.assertEqual((room, expect["bootstrap"]), (6, "10.0.0.1:8998"))
        self.assertIn(b'"prefix_len": 16', expect["destination_manifest"])
        client.events.append(event(6, TransferPoll.SUCCESS, bootstrap_token=42,
                                   speculative_ids=[1, 2], cached_tokens=16,
                                   first_token_logprob=-0.5))
        self.assertEqual(executor.generate_events(), [PD.RemotePrefillDoneEvent("r1", 42)])
        self.assertEqual(executor.pop_remote_cache_slot("r1"), 5)
        self.assertEqual(executor.pop_remote_spec_candidate_ids("r1"), (5, [1, 2]))
        self.assertEqual(executor.pop_remote_prefill_extras("r1"), (16, -0.5))
        self.assertIsNone(executor.pop_remote_cache_slot("r1"))

    def test_a_failed_room_with_held_pages_is_told_only_once_they_are_released(self):
        client, executor = expecting(6)
        client.events.append(failed(6, Pages.HELD))
        self.assertEqual(executor.generate_events(), [])
        self.assertEqual(executor.generate_events(), [])
        client.events.append(released(6))
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])
        self.assertEqual(client.named("abort"), [])  # it had ended: nothing to abort

    def test_a_success_without_a_token_is_failed(self):
        client, executor = expecting(2)
        client.events.append(event(2, TransferPoll.SUCCESS, bootstrap_token=-1))
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])

    def test_mixed_batches_are_refused(self):
        batch = Forward.Batch(["a", "b"], 1, block_tables=TABLES)
        with self.assertRaisesRegex(RuntimeError, "does not support mixed batches"):
            decode(FakeClient()).execute(batch)


class TpVoteTest(unittest.TestCase):
    def test_agree_is_one_min_of_three_numbers_a_room(self):
        seen = []

        def reduce(values):
            seen.append(list(values))
            return [min(a, b) for a, b in zip(values, [5, 0, 1, 2, 1, 1])]

        rooms = [Local(5, False, False), Local(4, False, True)]
        self.assertEqual(agree(rooms, reduce), [Agreed(5, True, False), Agreed(2, False, True)])
        self.assertEqual(seen, [[5, 1, 1, 4, 1, 0]])

    def test_a_room_failed_on_another_rank_is_aborted_here_and_told_once_safe(self):
        client = FakeClient()
        other = [2, 0, 1]  # the other rank: Bootstrapped, failed it, pages safe

        def reduce(values):
            return [min(a, b) for a, b in zip(values, other)]

        executor = decode(client, reduce=reduce)
        executor.register("r1", Info(8))
        executor.execute(extend("r1", 0, 50, 50))  # in flight here
        self.assertEqual(executor.generate_events(), [])
        self.assertEqual(client.named("abort")[0][1], 8)
        client.events.append(failed(8, Pages.HELD))
        self.assertEqual(executor.generate_events(), [])
        client.events.append(released(8))
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])

    def test_success_needs_every_rank(self):
        client = FakeClient()
        other = [4, 1, 0]  # the other rank still transferring

        def reduce(values):
            return [min(a, b) for a, b in zip(values, other)]

        executor = prefill(client, reduce=reduce)
        executor.register("r1", Info(1))
        client.events.append(bootstrapped(1, (0, 20)))
        executor.generate_events()
        executor.store_prefill_token("r1", 0, 3)
        executor.execute(after_forward("r1"))
        client.events.append(event(1, TransferPoll.SUCCESS))
        self.assertEqual(executor.generate_events(), [])
        other[:] = [5, 1, 1]
        self.assertEqual(executor.generate_events(), [PD.SucceededEvent("r1")])


class LostSidecarTest(unittest.TestCase):
    def test_rooms_fail_the_sidecar_is_started_again_and_given_the_arena(self):
        client = FakeClient()
        sidecar = FakeSidecar()
        attached = []
        executor = decode(client, sidecar=sidecar, attach=lambda: attached.append(1))
        executor.register("r1", Info(3))
        executor.generate_events()
        executor.execute(extend("r1", 0, 50, 50))
        # The client reports the room itself: the process is gone, nothing can land.
        client.sidecar_lost = "engine API x: the sidecar is lost (its process 100 is gone)"
        client.events.append(failed(3, Pages.REUSABLE, "sidecar lost"))
        sidecar.gone = "kvrail: kvrail sidecar (pid 100) killed by signal 9"
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r1")])
        self.assertEqual(sidecar.starts, 1)
        executor.register("r2", Info(4))  # refused while lost: failed at once
        self.assertEqual(executor.generate_events(), [PD.FailedEvent("r2")])
        client.sidecar_lost = None
        client.pid_now = 200
        executor.generate_events()
        self.assertEqual(attached, [1])

    def test_close_aborts_what_is_in_flight_and_stops_the_sidecar(self):
        client = FakeClient()
        sidecar = FakeSidecar()
        executor = decode(client, sidecar=sidecar)
        executor.register("r1", Info(3))
        executor.execute(extend("r1", 0, 50, 50))
        executor.close()
        self.assertEqual(client.named("abort")[0][1], 3)
        self.assertTrue(client.closed and sidecar.stopped)


class SettingsTest(unittest.TestCase):
    TOPOLOGY = types.SimpleNamespace(tp_size=2, tp_rank=1, dp_size=2, dp_rank=1, cp_size=1,
                                     global_rank=3)

    def test_tokenspeeds_timeouts_become_sidecar_flags(self):
        flags = settings.timeout_flags({"TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT": "600",
                                        "TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL": "1"})
        self.assertEqual(flags, ["--bootstrap-timeout", "120", "--waiting-timeout", "600",
                                 "--heartbeat-interval", "2", "--heartbeat-failures", "2"])
        with self.assertRaisesRegex(ValueError, "BOOTSTRAP_TIMEOUT='soon' is not a number"):
            settings.timeout_flags({"TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "soon"})

    def test_a_prefill_ranks_sidecar(self):
        topology = settings.topology_of(self.TOPOLOGY)
        plan = settings.plan_sidecar("prefill", topology, "10.0.0.1:8998",
                                     {"KVRAIL_BIN": "/opt/kvrail",
                                      "KVRAIL_SIDECAR_ARGS": "--tls tcp"}, "77", "mlx5_0")
        self.assertEqual(plan.endpoint, "ipc:///tmp/kvrail-tokenspeed-77-prefill3.sock")
        self.assertEqual(plan.argv[:9], ["/opt/kvrail", "sidecar", "--role", "prefill",
                                         "--engine-endpoint", plan.endpoint, "--tp-size", "2",
                                         "--tp-rank"])
        self.assertIn("--dp-rank", plan.argv)
        self.assertEqual(plan.argv[-6:], ["--backend", "verbs", "--rdma-devices", "mlx5_0",
                                          "--tls", "tcp"])

    def test_an_operators_sidecar_is_attached(self):
        topology = settings.topology_of(self.TOPOLOGY)
        plan = settings.plan_sidecar("decode", topology, None, {
            "KVRAIL_SIDECAR_ENDPOINT": "ipc:///run/kvrail/{role}{rank}.sock"}, "1")
        self.assertEqual(plan, settings.SidecarPlan("ipc:///run/kvrail/decode3.sock", []))
        with self.assertRaisesRegex(ValueError, "KVRAIL_SIDECAR_ENDPOINT='{pp}'"):
            settings.plan_sidecar("decode", topology, None,
                                  {"KVRAIL_SIDECAR_ENDPOINT": "{pp}"}, "1")

    def test_what_kvrail_cannot_serve_is_refused_in_one_line(self):
        with self.assertRaisesRegex(ValueError, "context parallelism \\(cp_size=2\\)"):
            settings.topology_of(types.SimpleNamespace(**dict(vars(self.TOPOLOGY), cp_size=2)))
        with self.assertRaisesRegex(ValueError, "mode is 'encode'"):
            settings.plan_sidecar("encode", settings.topology_of(self.TOPOLOGY), None, {}, "1")
        with self.assertRaisesRegex(ValueError, "needs its node's bootstrap address"):
            settings.plan_sidecar("prefill", settings.topology_of(self.TOPOLOGY), None, {}, "1")


class ArenaTest(unittest.TestCase):
    def maps(self, text):
        path = os.path.join(tempfile.mkdtemp(), "maps")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_a_shared_memory_arena_is_found_by_its_address(self):
        maps = self.maps("1000-2000 rw-p 00000000 00:00 0 \n"
                         "3000-5000 rw-s 00000000 00:19 7 /dev/shm/kv-rank0\n")
        self.assertEqual(arena.shm_mapping(0x3000, maps), arena.ShmArena("/kv-rank0"))
        self.assertIsNone(arena.shm_mapping(0x1800, maps))
        with self.assertRaisesRegex(arena.ArenaError, "starts 256 bytes into /dev/shm/kv-rank0"):
            arena.shm_mapping(0x3100, maps)

    def test_private_memory_is_refused(self):
        buffer = bytearray(1 << 20)
        import ctypes
        address = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
        if arena.cuda_allocation(address) is None:
            with self.assertRaisesRegex(arena.ArenaError, "neither in POSIX shared memory"):
                arena.locate(address)

    def test_expandable_segments_are_named(self):
        self.assertTrue(arena.expandable_segments(
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}))
        self.assertFalse(arena.expandable_segments({}))

    def test_the_arena_size_is_the_contracts(self):
        self.assertEqual(arena.arena_bytes(
            b'{"plan": {"num_lcm_blocks": 32, "lcm_block_bytes": 2048}}'), 33 * 2048)
        with self.assertRaisesRegex(arena.ArenaError, "no plan with num_lcm_blocks"):
            arena.arena_bytes(b"{}")


class LauncherTest(unittest.TestCase):
    """launcher.Supervised on stand-in programs (a shell that says the ready line, or not)."""

    def supervised(self, script, ready="sidecar ready"):
        log = os.path.join(tempfile.mkdtemp(), "sidecar.log")
        return Supervised(["/bin/sh", "-c", script], ready, log, timeout=5), log

    def test_a_process_is_ready_on_its_line_and_its_end_is_said_in_one_line(self):
        process, log = self.supervised(
            "echo oops >&2; echo 'sidecar ready engine=x'; exec sleep 30")
        self.assertEqual(process.start(), "sidecar ready engine=x")
        self.assertIsNone(process.exited())
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while process.exited() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertRegex(process.exited(), "^kvrail: /bin/sh -c \\(pid \\d+\\) killed by "
                                           "signal 9; its log: " + log)
        process.stop()
        with open(log) as f:
            self.assertIn("oops", f.read())

    def test_a_process_that_says_something_else_is_refused_naming_it(self):
        process, log = self.supervised("echo 'usage: kvrail ...'; exit 2")
        with self.assertRaisesRegex(LaunchError, "did not say 'sidecar ready' within 5 s \\(it "
                                                 "said 'usage: kvrail ...'\\); its log: " + log):
            process.start()

    def test_a_missing_binary_names_kvrail_bin(self):
        process = Supervised(["/nonexistent/kvrail", "sidecar"], "sidecar ready",
                             os.path.join(tempfile.mkdtemp(), "log"))
        with self.assertRaisesRegex(LaunchError, "cannot run /nonexistent/kvrail: .*KVRAIL_BIN"):
            process.start()


class HookPiecesTest(unittest.TestCase):
    """The hook's replacements on tokenspeed-shaped fakes (tests/tokenspeed:e2e_test runs the
    whole hook against tokenspeed itself)."""

    def test_the_enum_gets_kvrail(self):
        class TransferBackend(enum.Enum):
            MOONCAKE = "mooncake"

        hook._add_member(TransferBackend)
        self.assertIs(TransferBackend("kvrail"), TransferBackend.KVRAIL)
        self.assertEqual([m.value for m in TransferBackend], ["mooncake", "kvrail"])

    def test_the_server_argument_admits_kvrail(self):
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--disaggregation-transfer-backend", choices=["mooncake"])

        hook._patch_server_args(types.SimpleNamespace(ServerArgs=ServerArgs))
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        args = parser.parse_args(["--disaggregation-transfer-backend", "kvrail"])
        self.assertEqual(args.disaggregation_transfer_backend, "kvrail")

    def test_the_event_loop_sees_mooncake_while_kvrail_is_built(self):
        module = types.ModuleType("fake_event_loop")

        class EventLoop:  # tokenspeed's check, then its create_kv_transfer call by keyword
            def __init__(self, server_args):
                backend = server_args.disaggregation_transfer_backend
                if backend != "mooncake":
                    raise NotImplementedError("non-Mooncake transfer backend")
                self.kv_transfer = module.create_kv_transfer(
                    mode="decode", backend=backend, args=1, kv_args=2, gloo_group=3)

        module.EventLoop = EventLoop
        factory = types.ModuleType(hook.FACTORY)
        factory.create_kv_transfer = hook._create_kv_transfer(lambda *args: "mooncake's")
        saved = sys.modules.get(hook.FACTORY), hook.choice.create_kv_transfer
        sys.modules[hook.FACTORY] = factory
        hook.choice.create_kv_transfer = lambda mode, args, kv_args, group: ("kvrail's", mode)
        try:
            hook._patch_event_loop(module)
            kvrail = types.SimpleNamespace(disaggregation_transfer_backend="kvrail")
            self.assertEqual(EventLoop(kvrail).kv_transfer, ("kvrail's", "decode"))
            self.assertEqual(kvrail.disaggregation_transfer_backend, "kvrail")
            mooncake = types.SimpleNamespace(disaggregation_transfer_backend="mooncake")
            self.assertEqual(EventLoop(mooncake).kv_transfer, "mooncake's")
        finally:
            if saved[0] is None:
                del sys.modules[hook.FACTORY]
            else:
                sys.modules[hook.FACTORY] = saved[0]
            hook.choice.create_kv_transfer = saved[1]

    def test_a_module_imported_later_is_patched_right_after_it_runs(self):
        root = tempfile.mkdtemp()
        os.makedirs(os.path.join(root, "later_pkg"))
        open(os.path.join(root, "later_pkg", "__init__.py"), "w").close()
        with open(os.path.join(root, "later_pkg", "loop.py"), "w") as f:
            f.write("VALUE = 'tokenspeed'\n")
        sys.path.insert(0, root)
        try:
            hook.after_import("later_pkg.loop", lambda m: setattr(m, "VALUE", "patched"))
            import later_pkg.loop  # noqa: PLC0415
            self.assertEqual(later_pkg.loop.VALUE, "patched")
        finally:
            sys.path.remove(root)

    def test_replace_reaches_modules_that_imported_the_name(self):
        def original():
            return "mooncake"

        owner = types.ModuleType("owner_fake")
        owner.choose = original
        user = types.ModuleType("user_fake")
        user.choose = original
        sys.modules["owner_fake"], sys.modules["user_fake"] = owner, user
        hook._replace(owner, "choose", lambda: "kvrail")
        self.assertEqual((owner.choose(), user.choose()), ("kvrail", "kvrail"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
