"""A real etcd for the registry tests (/usr/bin/etcd, one member on 127.0.0.1, free ports, data
under $TEST_TMPDIR), and its JSON gateway (keys and values base64)."""

import base64
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """Starts etcd and waits for its /health to say true. A start that exits (a port the kernel
    handed out and another test took before etcd bound it) is tried again on fresh ports, up to
    TRIES times; an etcd that stays up and unhealthy for SECONDS (a loaded machine) fails the
    test with the tail of its log in the message, so CI's output says why."""

    TRIES = 3
    SECONDS = 60

    def __init__(self):
        reasons = []
        for _ in range(self.TRIES):
            reason = self._start()
            if reason is None:
                return
            reasons.append(reason)
            if "exited" not in reason:
                break
        raise AssertionError("etcd did not come up (%d tries):\n%s"
                             % (len(reasons), "\n".join(reasons)))

    def _start(self):
        """Starts one etcd; None once it is healthy, else why not (the log's tail included)."""
        self.port = free_port()
        peer = free_port()
        while peer == self.port:
            peer = free_port()
        self.data = tempfile.mkdtemp(prefix="etcd-", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
        client_url = "http://127.0.0.1:%d" % self.port
        peer_url = "http://127.0.0.1:%d" % peer
        self.log = open(self.data + ".log", "w")
        self.process = subprocess.Popen(
            ["/usr/bin/etcd", "--name", "t", "--data-dir", self.data,
             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", "t=" + peer_url], stdout=self.log, stderr=self.log)
        self.endpoint = "127.0.0.1:%d" % self.port
        self.url = "etcd://" + self.endpoint
        start = time.time()
        last = "no answer yet"
        while time.time() - start < self.SECONDS:
            if self.process.poll() is not None:
                return self._failed("exited with status %d after %.1f s"
                                    % (self.process.returncode, time.time() - start))
            try:
                with urllib.request.urlopen(client_url + "/health", timeout=1) as r:
                    body = r.read()
                    if b'"true"' in body:
                        return None
                    last = "GET /health answered %r" % body[:200]
            except OSError as e:
                last = "GET /health: %s" % e
            time.sleep(0.05)
        return self._failed("not healthy after %d s (%s)" % (self.SECONDS, last))

    def _failed(self, what):
        self.stop()
        with open(self.data + ".log", errors="replace") as log:
            tail = log.readlines()[-15:]
        return "etcd on 127.0.0.1:%d (data %s): %s; the end of its log:\n%s" % (
            self.port, self.data, what, "".join("  | " + line for line in tail))

    def call(self, path, body):
        request = urllib.request.Request("http://%s%s" % (self.endpoint, path),
                                         data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=5) as r:
            return json.loads(r.read())

    def get(self, key):
        """The value of `key` (str), or None."""
        answer = self.call("/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = answer.get("kvs", [])
        return base64.b64decode(kvs[0].get("value", "")).decode() if kvs else None

    def keys(self, prefix):
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        answer = self.call("/v3/kv/range", {"key": base64.b64encode(prefix.encode()).decode(),
                                            "range_end": base64.b64encode(end.encode()).decode()})
        return [base64.b64decode(kv["key"]).decode() for kv in answer.get("kvs", [])]

    def await_key(self, key, present, seconds):
        """Polls until `key` is present (or absent); the seconds it took, or None."""
        return self.await_true(lambda: (self.get(key) is not None) == present, seconds)

    def await_keys(self, prefix, count, seconds):
        """Polls until exactly `count` keys are under `prefix`; the seconds it took, or None."""
        return self.await_true(lambda: len(self.keys(prefix)) == count, seconds)

    def await_true(self, condition, seconds):
        """Polls `condition()` until it is true; the seconds it took, or None."""
        start = time.time()
        while time.time() - start < seconds:
            if condition():
                return time.time() - start
            time.sleep(0.05)
        return None

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.log.close()
