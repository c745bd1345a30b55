#!/usr/bin/python3
"""kvrail as tokenspeed's transfer backend, end to end against tokenspeed's own code: its
executors built by its own create_kv_transfer (the backend chosen by kvrail_tokenspeed.hook on
an unpatched checkout), its CPU MHA cache pools with their arenas in shared memory, its
get_kv_args and manifests; the prefill's batches through its event loop's _dispatch_forward
(paths 4 and 3), the decode's events through its _process_kv_transfer_events; real kvrail
sidecars (started by the executors, --verify-digest) and a real kvrail bootstrap server
(tokenspeed's BOOTSTRAP_SERVER class for kvrail). This test plays tokenspeed's replicated
scheduler: every TP rank of a side gets the same calls in the same iteration, each from its
own thread, and the TP vote is a real all-reduce among them (a barrier).

Cases: TP 2->1 (layer-wise, chunked, a decode prefix window, the prefill's cached prefix) and
1->2; MLA 2->1 (an idle prefill rank); two prefill DP groups; an abort on each side; a decode sidecar killed mid-room, and one
stopped mid-room; tokenspeed's waiting timeout as a deadline; a private arena refused; the
hook in a spawned rank; the patch. After every landed room every byte of the decode's pages of
the window is compared with the prefill ranks' pages through tokenspeed's K/V views
(get_key_buffer / get_value_buffer), and decode pages no room fetched must hold what they held.

Needs TOKENSPEED_SRC (a checkout of lightseekorg/tokenspeed) and torch (Debian's
python3-torch); without either, every case is recorded skipped with the reason
($XML_OUTPUT_FILE, result="skipped"), never passed.
"""

import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest
from xml.sax.saxutils import quoteattr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.getcwd(), "python"))

import tokenspeed_env as te  # noqa: E402

TAG = "%d-%06x" % (os.getpid(), random.getrandbits(24))
LAYERS, KV_HEADS, HEAD_DIM, PAGE, PAGES = 2, 4, 8, 16, 32
LATENT, ROPE = 12, 4  # an MLA pool's latent field: LATENT + ROPE wide, the same on every rank
SENTINEL = 0x5A  # every byte of a decode arena before any transfer


def write_skipped(reason):
    """The JUnit XML Bazel keeps (tools/run counts the target skipped, with the reason)."""
    path = os.environ.get("XML_OUTPUT_FILE")
    names = [name for name in dir(EndToEndTest) if name.startswith("test_")]
    cases = "".join('  <testcase name="%s" classname="EndToEndTest" status="notrun" '
                    'result="skipped"><skipped message=%s/></testcase>\n'
                    % (name, quoteattr(reason)) for name in names)
    xml = ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="%d" skipped="%d">\n'
           '<testsuite name="tokenspeed_e2e" tests="%d" skipped="%d">\n%s</testsuite>\n'
           '</testsuites>\n' % (len(names), len(names), len(names), len(names), cases))
    if path:
        with open(path, "w") as f:
            f.write(xml)
    print("SKIPPED (%d cases): %s" % (len(names), reason))


class RankThread:
    """One rank's thread: the calls a test makes of the rank's executor run here, in order
    (the client is used by the rank's own threads only)."""

    def __init__(self, name):
        self.calls = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            call, done = self.calls.get()
            if call is None:
                return
            try:
                done.put((True, call()))
            except BaseException as error:  # noqa: BLE001 - handed to the test's thread
                done.put((False, error))

    def submit(self, call):
        done = queue.Queue()
        self.calls.put((call, done))
        return done

    def stop(self):
        self.calls.put((None, None))


class Lockstep:
    """The TP group's all-reduce (MIN) among the ranks' threads: tokenspeed's gloo all-reduce,
    in one process."""

    def __init__(self, ranks):
        self.barrier = threading.Barrier(ranks)
        self.values = [None] * ranks
        self.result = None

    def reduce_for(self, rank):
        def reduce(values):
            self.values[rank] = list(values)
            if self.barrier.wait() == 0:
                self.result = [min(column) for column in zip(*self.values)]
            self.barrier.wait()
            return list(self.result)
        return reduce


class Side:
    """The TP ranks of one role: each a real tokenspeed cache pool (arena in /dev/shm), the
    KVArgs of tokenspeed's get_kv_args, and the executor of tokenspeed's create_kv_transfer for
    backend "kvrail" (it starts the rank's sidecar)."""

    def __init__(self, role, tp, bootstrap_port, layerwise=False, dp_size=1, dp_rank=0,
                 mla=False):
        import torch
        from tokenspeed.runtime.pd.factory import create_kv_transfer

        self.role, self.tp = role, tp
        self.name = "%s%d" % (role, dp_rank)
        self.pools, self.executors, self.counters, self.threads = [], [], [], []
        group = Lockstep(tp) if tp > 1 else None
        config = te.model_config(layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
        for rank in range(tp):
            shm_name = "kvrail-ts-%s-%s-%d" % (TAG, self.name, rank)
            if mla:
                pool = te.mla_pool(shm_name=shm_name, layers=LAYERS, latent=LATENT, rope=ROPE,
                                   page_tokens=PAGE, pages=PAGES)
            else:
                pool = te.mha_pool(shm_name=shm_name, layers=LAYERS, kv_heads=KV_HEADS,
                                   tp_size=tp, head_dim=HEAD_DIM, page_tokens=PAGE, pages=PAGES)
            if role == "decode":
                pool.arena.buffer.fill_(SENTINEL)
            kv_args = te.kv_args(pool, config, rank)
            args = te.manager_args(tp_size=tp, tp_rank=rank, dp_size=dp_size, dp_rank=dp_rank,
                                   bootstrap_port=bootstrap_port)
            thread = RankThread("%s%d" % (role, rank))
            self.threads.append(thread)
            executor = self.on(rank, lambda: create_kv_transfer(
                mode=role, backend="kvrail", args=args, kv_args=kv_args, gloo_group=None))
            if group is not None:
                executor.reduce = group.reduce_for(rank)
            if layerwise:
                counter = FakeCounter()
                self.on(rank, lambda: executor.register_layerwise_step_counter(counter, 1))
                self.counters.append(counter)
            self.pools.append(pool)
            self.executors.append(executor)
        self.torch = torch
        self.free = list(range(PAGES, 0, -1))  # the replicated scheduler's page allocator

    def on(self, rank, call):
        ok, value = self.threads[rank].submit(call).get(timeout=120)
        if not ok:
            raise value
        return value

    def all(self, call):
        """call(rank, executor) on every rank at once (each on its thread); the results."""
        waits = [t.submit(lambda r=r: call(r, self.executors[r]))
                 for r, t in enumerate(self.threads)]
        results = []
        for done in waits:
            ok, value = done.get(timeout=120)
            if not ok:
                raise value
            results.append(value)
        return results

    def events(self):
        """One scheduler iteration's generate_events(): the same on every rank."""
        results = self.all(lambda r, ex: ex.generate_events())
        for other in results[1:]:
            assert other == results[0], (self.role, results)
        return results[0]

    def take_pages(self, n):
        taken, self.free = self.free[-n:], self.free[:-n]
        return list(reversed(taken))

    def close(self):
        self.all(lambda r, ex: ex.close())
        for thread in self.threads:
            thread.stop()
        for rank in range(len(self.pools)):
            name = "/dev/shm/kvrail-ts-%s-%s-%d" % (TAG, self.name, rank)
            if os.path.exists(name):
                os.unlink(name)


class FakeCounter:
    """tokenspeed's StepCounter interface on the CPU (its own needs CUDA)."""

    def __init__(self):
        self.cache_step = 0
        self.ready = 0

    def current_step(self):
        return self.cache_step, 0

    def advance_step(self, delta_cache_step, delta_aux_step):
        self.cache_step += delta_cache_step

    def record_cache(self):
        self.ready += 1

    def query_ready_cache_step(self):
        return self.ready


def value(room, layer, kind, head, token, dim):
    """The K (kind 0) or V (1) element the fake forward pass computes: an integer below 251,
    exact in bf16."""
    return (room * 131 + layer * 17 + kind * 7 + head * 5 + token * 3 + dim) % 251


class Request:
    def __init__(self, rid, room, prompt_len, decode_prefix=0, prefill_cached=0, chunk=64,
                 group=None):
        self.rid, self.room, self.prompt_len = rid, room, prompt_len
        self.group = room if group is None else group  # the prefill DP group it is sent to
        self.decode_prefix, self.prefill_cached, self.chunk = decode_prefix, prefill_cached, chunk
        self.token = 1000 + room
        self.spec = [room % 7, room % 11]
        self.prefill_pages = []
        self.decode_pages = []


class Deployment:
    """A kvrail bootstrap server, a prefill side and a decode side, and the scheduler loop of
    each, played by the test."""

    def __init__(self, prefill_tp, decode_tp, layerwise, prefill_dp=1, mla=False):
        from kvrail_tokenspeed.backend import kv_class
        from tokenspeed.runtime.pd.utils import KVClassType

        server = kv_class(KVClassType.BOOTSTRAP_SERVER)
        self.bootstrap = server(0, host="127.0.0.1")
        self.prefills, self.decode = [], None
        try:
            for group in range(prefill_dp):  # each DP group its own scheduler (DP attention)
                self.prefills.append(Side("prefill", prefill_tp, self.bootstrap.port, layerwise,
                                          dp_size=prefill_dp, dp_rank=group, mla=mla))
            self.decode = Side("decode", decode_tp, self.bootstrap.port, mla=mla)
        except BaseException:
            self.close()
            raise
        self.layerwise = layerwise
        self.mla = mla

    def close(self):
        for side in self.prefills + [self.decode]:
            if side is not None:
                side.close()
        self.bootstrap.close()

    def info(self, request):
        from tokenspeed.runtime.pd.base.bootstrap import BootstrapInfo
        info = BootstrapInfo.__new__(BootstrapInfo)
        info.bootstrap_host, info.bootstrap_port = "127.0.0.1", self.bootstrap.port
        info.bootstrap_room = request.room
        return info

    def tables(self, pages, row_count=1):
        import numpy
        return {"full_attention": numpy.array([pages + [0] * (PAGES - len(pages))])}

    # The decode's scheduler ---------------------------------------------------------------

    def admit_decode(self, request):
        from tokenspeed_scheduler import Forward
        side = self.decode
        side.all(lambda r, ex: ex.register(request.rid, self.info(request)))
        events = side.events()
        assert events and type(events[0]).__name__ == "BootstrappedEvent", events
        request.decode_pages = side.take_pages(-(-request.prompt_len // PAGE))
        op = Forward.Batch([request.rid], 1, extend_prefix_lens=[request.decode_prefix],
                           input_lengths=[request.prompt_len - request.decode_prefix],
                           prefill_lengths=[request.prompt_len], request_pool_indices=[3],
                           block_tables=self.tables(request.decode_pages))
        side.all(lambda r, ex: ex.execute(op))

    # The prefill's scheduler ----------------------------------------------------------------

    @property
    def prefill(self):
        return self.prefills[0]

    def prefill_of(self, request):
        """The prefill DP group a router sends the request to: room mod dp_size (CachePD)."""
        return self.prefills[request.group % len(self.prefills)]

    def admit_prefill(self, request):
        self.prefill_of(request).all(lambda r, ex: ex.register(request.rid, self.info(request)))

    def forward(self, request, layer_pause=0.0):
        """The prefill's forward pass of the request, chunk by chunk, each through tokenspeed's
        EventLoop._dispatch_forward (its path 4: reset, prepare_prefill, the model's forward,
        and store_prefill_token handed back as on_first_token, called as the output processor
        does). The model's forward writes each layer's K and V of the chunk's tokens through
        tokenspeed's views and advances the step counter per layer, as the attention backend
        records it. Returns the batch of the next iteration (path 3: execute)."""
        from tokenspeed_scheduler import Forward
        side = self.prefill_of(request)
        request.prefill_pages = side.take_pages(-(-request.prompt_len // PAGE))
        tables = self.tables(request.prefill_pages)
        heads = KV_HEADS // side.tp
        if request.prefill_cached:  # the prefill's own prefix cache holds them already
            for rank, pool in enumerate(side.pools):
                self.fill(pool, request, rank * heads, heads, 0, request.prefill_cached, LAYERS)
        begin = request.prefill_cached
        while begin < request.prompt_len:
            end = min(begin + request.chunk, request.prompt_len)
            op = Forward.Batch([request.rid], 1, extend_prefix_lens=[begin],
                               input_lengths=[end - begin], prefill_lengths=[request.prompt_len],
                               request_pool_indices=[1], block_tables=tables)

            def model_forward(rank, begin=begin, end=end):
                for layer in range(LAYERS):
                    self.fill(side.pools[rank], request, rank * heads, heads, begin, end,
                              layer + 1, layer)
                    if side.counters:
                        side.counters[rank].record_cache()
                    time.sleep(layer_pause)

            def dispatch(rank, executor, op=op, last=end == request.prompt_len):
                results, on_first_token = PrefillLoop(executor, rank, model_forward).dispatch(op)
                assert results == "forward %d" % rank and on_first_token is not None
                if last:
                    on_first_token(request.rid, 1, request.token, request.spec)

            side.all(dispatch)
            begin = end
        return Forward.Batch([request.rid], 0, block_tables=tables)

    def views(self, pool, layer):
        """(kind, view) of a layer: K and V, or an MLA pool's one latent view."""
        if self.mla:
            return [(0, pool.get_key_buffer(layer))]
        return [(0, pool.get_key_buffer(layer)), (1, pool.get_value_buffer(layer))]

    def fill(self, pool, request, first_head, heads, begin, end, layers, only=None):
        torch = self.decode.torch
        if self.mla:  # the latent is replicated: every rank computes the same
            first_head, heads = 0, 1
        width = LATENT + ROPE if self.mla else HEAD_DIM
        for layer in range(layers) if only is None else [only]:
            for kind, view in self.views(pool, layer):
                for token in range(begin, end):
                    row = request.prefill_pages[token // PAGE] * PAGE + token % PAGE
                    view[row] = torch.tensor(
                        [[value(request.room, layer, kind, first_head + h, token, d)
                          for d in range(width)] for h in range(heads)],
                        dtype=torch.bfloat16)

    # Both -------------------------------------------------------------------------------------

    def run(self, requests, until, seconds=60.0, prefill_hook=None):
        """Iterations of both schedulers until `until(outcomes)`; outcomes by (side, rid)."""
        outcomes = {}
        pending_execute = []
        deadline = time.monotonic() + seconds
        while not until(outcomes):
            assert time.monotonic() < deadline, ("no outcome in %.0f s" % seconds, outcomes)
            for side, op in pending_execute:  # path 3 of the event loop's dispatch
                side.all(lambda r, ex: PrefillLoop(ex, r, None).dispatch(op))
            pending_execute = []
            for side in self.prefills:
                for event in side.events():
                    name = type(event).__name__
                    if name == "BootstrappedEvent":
                        request = requests[event.request_id]
                        if prefill_hook is not None and prefill_hook(request):
                            continue
                        pending_execute.append(
                            (side, self.forward(request, 0.05 if self.layerwise else 0)))
                    else:
                        outcomes[("prefill", event.request_id)] = name
            for event in self.decode_events():
                outcomes[("decode", event.request_id)] = (
                    type(event).__name__, getattr(event, "bootstrap_token", None))
            time.sleep(0.002)
        return outcomes

    def decode_events(self):
        """The decode's events, consumed by tokenspeed's own event loop code
        (EventLoop._process_kv_transfer_events, on a stand-in of the loop's state)."""
        events = self.decode.events()
        if events:
            from tokenspeed.runtime.engine.event_loop import EventLoop
            for rank, executor in enumerate(self.decode.executors):
                loop = LoopState(executor)
                EventLoop._process_kv_transfer_events(loop, events)
                executor.loop_seen = getattr(executor, "loop_seen", []) + loop.seen
        return events

    # Checks -----------------------------------------------------------------------------------

    def check_bytes(self, request):
        """Every byte of the decode pages of the request: the window's pages equal the prefill
        ranks' pages (heads placed by each side's TP), the pages before the window untouched."""
        torch = self.decode.torch
        prefill_pools = self.prefill_of(request).pools
        window = range(request.decode_prefix // PAGE, -(-request.prompt_len // PAGE))
        # Heads concatenate across TP ranks; an MLA latent is every rank's (the first's, here).
        if self.mla:
            prefill_pools, decode_pools = prefill_pools[:1], self.decode.pools[:1]
        else:
            decode_pools = self.decode.pools
        for layer in range(LAYERS):
            for kind in range(len(self.views(prefill_pools[0], layer))):
                getter = kind == 0 and "get_key_buffer" or "get_value_buffer"
                prefill = torch.cat([getattr(p, getter)(layer) for p in prefill_pools], 1)
                decode = torch.cat([getattr(p, getter)(layer) for p in decode_pools], 1)
                for slot, (src, dst) in enumerate(zip(request.prefill_pages,
                                                      request.decode_pages)):
                    got = decode[dst * PAGE:(dst + 1) * PAGE].view(torch.int16)
                    if slot in window:
                        want = prefill[src * PAGE:(src + 1) * PAGE].view(torch.int16)
                        assert torch.equal(got, want), (request.rid, layer, getter, slot)
                    else:
                        raw = got.view(torch.uint8)
                        assert bool((raw == SENTINEL).all()), (request.rid, "prefix page "
                                                                "written", layer, slot)


    def check_untouched(self):
        """The decode pages no room was given (block 0 among them) hold what they held."""
        torch = self.decode.torch
        for pool in self.decode.pools:
            for layer in range(LAYERS):
                for _, view in self.views(pool, layer):
                    for page in [0] + self.decode.free:
                        raw = view[page * PAGE:(page + 1) * PAGE].view(torch.uint8)
                        assert bool((raw == SENTINEL).all()), ("page never given", page)


class PrefillLoop:
    """What EventLoop._dispatch_forward reads of the loop on a prefill rank: its executor and
    a model executor whose forward pass is the test's."""

    def __init__(self, executor, rank, model_forward):
        self.kv_transfer = executor
        self.epd_admission = None

        class Model:
            def reset_valid_cache_length(self, op):
                pass

            def execute_forward_op_with_log(self, op, *args, **kwargs):
                model_forward(rank)
                return "forward %d" % rank

        self.model_executor = Model()

    def _get_multimodal_context_for_forward(self, op):
        return None

    def _assert_epd_embeddings_received(self, context):
        pass

    def dispatch(self, op):
        from tokenspeed.runtime.engine.event_loop import EventLoop
        return EventLoop._dispatch_forward(self, op, [], None)


class LoopState:
    """What EventLoop._process_kv_transfer_events reads of the loop: its executor, output
    processor and model executor, recording the calls it makes."""

    def __init__(self, executor):
        self.kv_transfer = executor
        self._pd_cache_enabled = True
        self.seen = []
        seen = self.seen

        class State:
            to_abort = False
            finished = False

            def set_finish_with_abort(self, reason):
                seen.append(("abort", reason))

        class Output:
            rid_to_state = {}

            def on_remote_prefill_done(self, rid, token):
                seen.append(("remote_prefill_done", rid, token))

            def finish_remote_prefill_only_request(self, rid):
                return []

            def finish_prefill_request(self, rid):
                return []

            def publish_finished_at_admission(self, rid, state):
                seen.append(("failed", rid))

        class Model:
            def write_remote_spec_candidate_ids(self, index, ids):
                seen.append(("spec", index, list(ids)))

            def mark_remote_cache_ready(self, slot):
                seen.append(("cache_ready", slot))

        self.output_processor = Output()
        self.output_processor.rid_to_state = _States(State)
        self.model_executor = Model()


class _States(dict):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def get(self, rid, default=None):
        return self.state()


def done(*keys):
    return lambda outcomes: all(key in outcomes for key in keys)


class EndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.environ.setdefault("KVRAIL_BIN", os.path.join(os.getcwd(), "tools", "kvrail"))
        os.environ["KVRAIL_SIDECAR_ARGS"] = "--host 127.0.0.1 --tls tcp --verify-digest"
        os.environ["KVRAIL_LOG_DIR"] = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", "/tmp")
        os.environ["TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL"] = "2"
        te.load()
        import kvrail_tokenspeed
        kvrail_tokenspeed.install()  # the unpatched checkout: the hook chooses kvrail

    def land(self, deployment, request):
        requests = {request.rid: request}
        deployment.admit_prefill(request)
        deployment.admit_decode(request)
        outcomes = deployment.run(requests, done(("prefill", request.rid),
                                                 ("decode", request.rid)))
        self.assertEqual(outcomes[("prefill", request.rid)], "SucceededEvent")
        self.assertEqual(outcomes[("decode", request.rid)],
                         ("RemotePrefillDoneEvent", request.token))
        deployment.check_bytes(request)
        deployment.check_untouched()
        for executor in deployment.decode.executors:  # the event loop's own calls
            self.assertIn(("remote_prefill_done", request.rid, request.token),
                          executor.loop_seen)
            self.assertIn(("spec", 3, request.spec), executor.loop_seen)
            self.assertIn(("cache_ready", 3), executor.loop_seen)
        return outcomes

    def fail_both(self, deployment, request, prefill_hook=None, seconds=60.0,
                  after_expect=None):
        """Admits `request` on both sides (then `after_expect`); both must end it with
        FailedEvent."""
        deployment.admit_prefill(request)
        deployment.admit_decode(request)
        if after_expect is not None:
            after_expect()
        if prefill_hook is None:  # the decode's own doing: the prefill never runs the room
            prefill_hook = lambda req: True  # noqa: E731
        outcomes = deployment.run({request.rid: request},
                                  done(("prefill", request.rid), ("decode", request.rid)),
                                  seconds=seconds, prefill_hook=prefill_hook)
        self.assertEqual(outcomes[("prefill", request.rid)], "FailedEvent")
        self.assertEqual(outcomes[("decode", request.rid)][0], "FailedEvent")
        return outcomes

    def test_1_tp2_to_tp1_layerwise_prefix_window_chunked(self):
        deployment = Deployment(2, 1, layerwise=True)
        try:
            self.land(deployment, Request("a", 11, 50, decode_prefix=16, chunk=32))
            # One LayersReady a layer, while the forward pass ran (its layers 50 ms apart).
            for executor in deployment.prefill.executors:
                self.assertEqual(executor.layers_ready_calls, LAYERS)
            self.land(deployment, Request("b", 12, 40, prefill_cached=16))
            # The hook replaced the event loop's start-up when tokenspeed imported it.
            from tokenspeed.runtime.engine.event_loop import EventLoop
            self.assertEqual(EventLoop.__init__.__module__, "kvrail_tokenspeed.hook")
            # The prefill's cached prefix reaches the decode (CachePD 2026-09), if its
            # contract revision carries it.
            extras = deployment.decode.executors[0].pop_remote_prefill_extras("b")
            print("decode extras of b (cached_tokens, first_token_logprob):", extras)
        finally:
            deployment.close()

    def test_2_tp1_to_tp2_without_layerwise(self):
        deployment = Deployment(1, 2, layerwise=False)
        try:
            self.land(deployment, Request("c", 21, 70))
            self.land(deployment, Request("d", 22, 33, decode_prefix=32))
        finally:
            deployment.close()

    def test_3_an_abort_on_each_side(self):
        deployment = Deployment(2, 1, layerwise=False)
        try:
            # Prefill aborts after its Bootstrapped, before its forward pass.
            def abort_on_prefill(req):
                deployment.prefill.all(lambda r, ex: ex.abort(req.rid, None, "test abort"))
                return True

            self.fail_both(deployment, Request("p-abort", 31, 40), abort_on_prefill)
            # Decode aborts after its Expect; the prefill never gets to run the room.
            self.fail_both(deployment, Request("d-abort", 32, 40), after_expect=lambda: (
                deployment.decode.all(lambda r, ex: ex.abort("d-abort", None, "test abort"))))
            # The next room lands on the same sidecars.
            self.land(deployment, Request("after", 33, 40))
        finally:
            deployment.close()

    def test_4_a_decode_sidecar_killed_mid_room(self):
        deployment = Deployment(1, 1, layerwise=True)
        try:
            sidecar = deployment.decode.executors[0].sidecar

            def kill_decode(req):  # the decode's sidecar dies before the prefill's forward
                os.kill(sidecar.pid, signal.SIGKILL)
                return False

            self.fail_both(deployment, Request("killed", 41, 40), kill_decode, seconds=90)
            # The executor started its sidecar again and gave it the arena: a room lands.
            deadline = time.monotonic() + 30
            while deployment.decode.executors[0]._lost and time.monotonic() < deadline:
                deployment.decode.events()
                time.sleep(0.05)
            self.assertGreaterEqual(sidecar.starts, 2)
            self.land(deployment, Request("after-kill", 42, 40))
        finally:
            deployment.close()

    def test_6_dp_attention_routes_each_room_to_its_prefill_group(self):
        deployment = Deployment(1, 1, layerwise=False, prefill_dp=2)
        try:
            self.land(deployment, Request("g1", 61, 40))  # room 61: group 1
            self.land(deployment, Request("g0", 62, 40))  # room 62: group 0
            # A request routed to the wrong group is failed there at once, never begun.
            wrong = Request("wrong", 63, 40, group=0)
            deployment.admit_prefill(wrong)
            outcomes = deployment.run({"wrong": wrong}, done(("prefill", "wrong")))
            self.assertEqual(outcomes[("prefill", "wrong")], "FailedEvent")
        finally:
            deployment.close()

    def test_7_a_stopped_decode_sidecar_holds_the_pages_until_it_is_back(self):
        deployment = Deployment(1, 1, layerwise=False)
        try:
            request = Request("stopped", 71, 40)
            deployment.admit_prefill(request)
            deployment.admit_decode(request)
            pid = deployment.decode.executors[0].sidecar.pid
            stopped = []

            def stop_decode(req):  # the pre-allocation reached the prefill: stop the decode's
                os.kill(pid, signal.SIGSTOP)
                stopped.append(time.monotonic())
                return True

            try:
                # Lost within the client's heartbeat timeout (3 s): the room is Failed with its
                # pages held, so tokenspeed must not hear FailedEvent (it would free them).
                outcomes = deployment.run(
                    {"stopped": request},
                    lambda o: bool(stopped) and time.monotonic() >= stopped[0] + 6,
                    prefill_hook=stop_decode)
                self.assertNotIn(("decode", "stopped"), outcomes)
                executor = deployment.decode.executors[0]
                self.assertIsNotNone(executor.client.sidecar_lost)
                self.assertTrue(executor.requests["stopped"].held)
            finally:
                os.kill(pid, signal.SIGCONT)
            # Back: the client attaches again, which voids the room there, fenced through the
            # prefill; the release notice lets FailedEvent out.
            outcomes = deployment.run({"stopped": request}, done(("decode", "stopped"),
                                                                 ("prefill", "stopped")),
                                      prefill_hook=lambda req: True)
            self.assertEqual(outcomes[("decode", "stopped")][0], "FailedEvent")
            self.assertEqual(outcomes[("prefill", "stopped")], "FailedEvent")
            self.land(deployment, Request("after-stop", 72, 40))
        finally:
            deployment.close()

    def test_8_tokenspeeds_waiting_timeout_is_the_decodes_deadline(self):
        os.environ["TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT"] = "2"
        try:
            deployment = Deployment(1, 1, layerwise=False)
        finally:
            del os.environ["TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT"]
        try:
            self.assertIn("--waiting-timeout 2", " ".join(
                deployment.decode.executors[0].sidecar.argv))
            started = time.monotonic()
            # The prefill never runs its forward pass: the decode's deadline fails the room.
            self.fail_both(deployment, Request("late", 81, 40))
            self.assertGreaterEqual(time.monotonic() - started, 2.0)
        finally:
            deployment.close()

    def test_9_an_arena_in_private_memory_is_refused_at_start_up(self):
        from kvrail_tokenspeed.arena import ArenaError
        from tokenspeed.runtime.pd.factory import create_kv_transfer

        pool = te.mha_pool(shm_name=None, layers=LAYERS, kv_heads=KV_HEADS, tp_size=1,
                           head_dim=HEAD_DIM, page_tokens=PAGE, pages=PAGES)
        config = te.model_config(layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
        with self.assertRaises(ArenaError) as refused:
            create_kv_transfer(mode="decode", backend="kvrail",
                               args=te.manager_args(tp_size=1, tp_rank=0),
                               kv_args=te.kv_args(pool, config, 0), gloo_group=None)
        message = str(refused.exception)
        self.assertNotIn("\n", message)
        self.assertIn("is neither in POSIX shared memory (/dev/shm) nor CUDA device memory",
                      message)

    def test_10_the_hook_reaches_the_rank_processes_an_engine_spawns(self):
        # tests/tokenspeed/spawn_probe.py stands in for tokenspeed's engine entry point (which
        # needs a model): a rank started with spawn must see tokenspeed choose kvrail.
        env = dict(os.environ, KVRAIL_ENGINE_MODULE="spawn_probe",
                   PYTHONPATH=os.pathsep.join([os.path.join(os.getcwd(), "python"), HERE]))
        run = subprocess.run([sys.executable, "-m", "kvrail_tokenspeed.engine"], env=env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout)
        self.assertIn("rank: main module kvrail_tokenspeed.engine, kvrail chosen: True",
                      run.stdout)

    def test_11_mla_tp2_to_tp1_with_an_idle_prefill_rank(self):
        # The latent is replicated: one prefill rank sends it, the other is CachePD's idle
        # (dummy) rank, Bootstrapped with no window; both must end the room succeeded.
        deployment = Deployment(2, 1, layerwise=True, mla=True)
        try:
            self.land(deployment, Request("mla", 111, 45))
            self.land(deployment, Request("mla-prefix", 112, 40, decode_prefix=16))
        finally:
            deployment.close()

    def test_5_the_patch_applies_and_chooses_kvrail_without_the_hook(self):
        patch = os.path.join(os.getcwd(), "python", "kvrail_tokenspeed", "tokenspeed.patch")
        source = os.environ["TOKENSPEED_SRC"]
        check = subprocess.run(["git", "apply", "--check", patch], cwd=source, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(check.returncode, 0, check.stdout)
        # Applied to a copy of the checkout's package, tokenspeed chooses kvrail by itself.
        copy = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "patched-%s" % TAG)
        shutil.copytree(os.path.join(source, "python", "tokenspeed"),
                        os.path.join(copy, "python", "tokenspeed"))
        try:
            applied = subprocess.run(["git", "apply", patch], cwd=copy, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self.assertEqual(applied.returncode, 0, applied.stdout)
            chosen = subprocess.run(
                [sys.executable, "-c", PATCHED_CHOICES], text=True, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=dict(os.environ, TOKENSPEED_SRC=copy,
                                                   PYTHONPATH=os.path.join(os.getcwd(), "python")))
            self.assertEqual(chosen.returncode, 0, chosen.stdout)
            self.assertEqual(chosen.stdout.strip().splitlines()[-1], "kvrail chosen 5 times")
        finally:
            shutil.rmtree(copy, ignore_errors=True)


# The five choices of a patched tokenspeed, with no hook installed (run in a process of its own).
PATCHED_CHOICES = """
import argparse, inspect, sys
sys.path.insert(0, %r)
import tokenspeed_env
tokenspeed_env.load()
from kvrail_tokenspeed.launcher import KvrailBootstrapServer
from tokenspeed.runtime.pd import factory, utils
from tokenspeed.runtime.engine import event_loop
from tokenspeed.runtime.utils.server_args import ServerArgs
assert "kvrail_tokenspeed.hook" not in sys.modules
chosen = 0
chosen += utils.TransferBackend("kvrail") is utils.TransferBackend.KVRAIL
chosen += utils.get_kv_class(utils.TransferBackend.KVRAIL,
                             utils.KVClassType.BOOTSTRAP_SERVER) is KvrailBootstrapServer
try:
    factory.create_kv_transfer("encode", "kvrail", None, None, None)
except NotImplementedError as error:
    chosen += str(error).startswith("kvrail: disaggregation mode 'encode'")
chosen += '("mooncake", "kvrail")' in inspect.getsource(event_loop.EventLoop.__init__)
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
chosen += parser.parse_args(["--disaggregation-transfer-backend", "kvrail"]
                            ).disaggregation_transfer_backend == "kvrail"
print("kvrail chosen %%d times" %% chosen)
""" % HERE


if __name__ == "__main__":
    why = te.missing()
    if why:
        write_skipped(why)
        sys.exit(0)
    unittest.main(verbosity=2)
