#!/usr/bin/python3
"""kvrail bootstrap --registry with etcd lost mid-run (issue 16): a PUT /route only queues its
body for the store's writer thread, so every registration is answered at once and served by
GET /route while etcd does not answer; the writer lands them when etcd is back, and a restarted
server replays them all."""

import json
import os
import signal
import sys
import time
import urllib.request
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "registry"))

from etcd import Etcd  # noqa: E402
from registry_test import KVRAIL, TMP, TAG, field, started  # noqa: E402

WORLD = 4
# A PUT /route answers in milliseconds; a writer on the HTTP path would take the etcd client's
# 2 s timeout per registration while etcd is stopped.
PROMPT_S = 1.0


class BootstrapEtcdOutageTest(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd()
        self.processes = []
        self.logs = []
        with open("examples/decode_contract_tp1.json") as f:
            self.contract = f.read()

    def tearDown(self):
        if self.etcd.process.poll() is None:
            self.etcd.process.send_signal(signal.SIGCONT)
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            process.stdout.close()
        for log in self.logs:
            log.close()
        self.etcd.stop()

    def start_bootstrap(self, port):
        path = os.path.join(TMP, "bootstrap-%s-%d.log" % (TAG, len(self.logs)))
        log = open(path, "w")
        self.logs.append(log)
        process, line = started([KVRAIL, "bootstrap", "--host", "127.0.0.1", "--port", str(port),
                                 "--registry", self.etcd.url, "--registry-ttl", "10"],
                                "bootstrap ready", stderr=log)
        self.processes.append(process)
        return process, int(field(line, "port")), path

    def register(self, port, rank):
        """PUT /route for engine rank `rank`; the seconds it took to be answered 200."""
        body = json.dumps({"role": "Prefill", "world_size": WORLD, "dp_size": 1,
                           "rank_ip": "127.0.0.1", "rank_port": 7000 + rank,
                           "engine_rank": rank, "cache_layout": self.contract}).encode()
        request = urllib.request.Request("http://127.0.0.1:%d/route" % port, data=body,
                                         method="PUT")
        start = time.time()
        with urllib.request.urlopen(request, timeout=10) as r:
            self.assertEqual(r.status, 200)
        return time.time() - start

    def answers(self, port):
        out = []
        for target in ["/route?engine_rank=-1&target_dp_group=-1"] + [
                "/route?engine_rank=%d&target_dp_group=0" % rank for rank in range(WORLD)]:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, target),
                                        timeout=5) as r:
                out.append((r.status, r.read().decode()))
        return out

    def stored(self, port):
        return self.etcd.keys(self.ranks(port))

    @staticmethod
    def ranks(port):
        return "/kvrail/v1/bootstrap/127.0.0.1:%d/ranks/" % port

    def test_registrations_are_answered_while_etcd_is_stopped_and_stored_when_it_returns(self):
        bootstrap, port, log_path = self.start_bootstrap(0)
        self.register(port, 0)
        self.assertIsNotNone(self.etcd.await_keys(self.ranks(port), 1, 10), self.stored(port))

        self.etcd.process.send_signal(signal.SIGSTOP)  # accepts connections, answers nothing
        # Rank 1 twice: the latest body replaces the one queued.
        took = [(rank, self.register(port, rank)) for rank in list(range(1, WORLD)) + [1]]
        print("PUT /route with etcd stopped answered in %s s" %
              ", ".join("%.3f" % t for _, t in took), flush=True)
        for rank, seconds in took:
            self.assertLess(seconds, PROMPT_S, "PUT /route of rank %d waited for etcd" % rank)
        before = self.answers(port)
        for rank in range(WORLD):
            self.assertEqual(before[rank + 1][0], 200)
            self.assertIn('"rank_port":%d' % (7000 + rank), before[rank + 1][1].replace(" ", ""))

        # Past the writer's 2 s etcd timeout: a failed write, retried, and an outage logged.
        time.sleep(3)
        self.assertEqual(self.answers(port), before)
        self.etcd.process.send_signal(signal.SIGCONT)
        landed = self.etcd.await_keys(self.ranks(port), WORLD, 10)
        self.assertIsNotNone(landed, "stored after SIGCONT: %s" % self.stored(port))
        print("the queued registrations reached etcd %.2f s after SIGCONT" % landed, flush=True)

        bootstrap.send_signal(signal.SIGKILL)
        bootstrap.wait()
        _, again, _ = self.start_bootstrap(port)
        self.assertEqual(again, port)
        self.assertEqual(self.answers(port), before)

        with open(log_path) as f:
            log = f.read()
        # One line for the outage (however many retries it took), one for its end.
        self.assertEqual(log.count("registry writer (etcd at %s)" % self.etcd.endpoint), 2, log)
        self.assertIn("the registry answers again", log)


if __name__ == "__main__":
    unittest.main(verbosity=2)
