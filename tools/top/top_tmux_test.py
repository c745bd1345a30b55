#!/usr/bin/python3
"""`kvrail top` as a person sees it: in a detached tmux session of 120x40 beside a running
`kvrail demo --metrics`, the pane captured as text. Each sidecar's row, nonzero rates while
rooms run, a DOWN row once a sidecar is killed, and the screen given back on q, Ctrl-C and
SIGTERM; `--once --json` against the same processes."""

import json
import os
import random
import re
import shlex
import signal
import subprocess
import time
import unittest

KVRAIL = os.path.join(os.getcwd(), "tools", "kvrail")
TAG = "%d-%08x" % (os.getpid(), random.getrandbits(32))
# Its own server and socket (short: a socket path has a length limit), removed at the end.
SOCKET = "/tmp/kvrail-top-%s.tmux" % TAG
TMUX = ["tmux", "-S", SOCKET]
TMPDIR = os.environ.get("TEST_TMPDIR", "/tmp")
ENV = dict(os.environ, TERM="xterm-256color")


def wait_for(what, check, timeout=60.0):
    """Polls check() until it returns something true; fails naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = check()
        if ok:
            return last
        time.sleep(0.25)
    raise AssertionError("%s: not within %.0f s; last seen:\n%s" % (what, timeout, last))


def tmux(*args):
    return subprocess.run(TMUX + list(args), env=ENV, check=True, capture_output=True,
                          text=True, timeout=20).stdout


def pane(session):
    return tmux("capture-pane", "-p", "-t", session)


def pane_flag(session, flag):
    return tmux("display-message", "-p", "-t", session, "#{%s}" % flag).strip()


def listening_pid(port):
    """The pid of the process listening on 127.0.0.1:`port` (from /proc: no ss needed)."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == "0100007F:%04X" % port and fields[3] == "0A":
                inodes.add("socket:[%s]" % fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) in inodes:
                    return int(pid)
        except OSError:
            continue
    raise AssertionError("nothing listens on 127.0.0.1:%d" % port)


def rows(text):
    """The frame's endpoint rows: {endpoint: [columns...]}."""
    found = {}
    for line in text.splitlines():
        columns = line.split()
        if columns and re.match(r"^[0-9.]+:\d+$", columns[0]):
            found[columns[0]] = columns
    return found


def number(column):
    """A rate column: "-" before the second scrape."""
    return 0.0 if column == "-" else float(column)


class TopTmuxTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.demo_out = os.path.join(TMPDIR, "demo-%s.out" % TAG)
        with open(cls.demo_out, "w") as out, open(cls.demo_out + ".err", "w") as err:
            # Enough rooms to run for some seconds, then the cluster held for the scrapes.
            cls.demo = subprocess.Popen(
                [KVRAIL, "demo", "--metrics", "--rooms", "80", "--min-prompt", "512",
                 "--max-prompt", "1024", "--metrics-hold", "120"],
                stdout=out, stderr=err, start_new_session=True)

        def addresses():
            with open(cls.demo_out) as out:
                found = re.findall(r"^\s+(\S+)\s+http://(127\.0\.0\.1:\d+)/metrics$", out.read(),
                                   re.M)
            return len(found) == 4, dict(found)
        cls.metrics = wait_for("the demo's four metrics addresses", addresses, timeout=60)
        cls.endpoints = ",".join(cls.metrics[name] for name in
                                 ["bootstrap", "prefill-sidecar-0", "prefill-sidecar-1",
                                  "decode-sidecar-0"])

    @classmethod
    def tearDownClass(cls):
        subprocess.run(TMUX + ["kill-server"], env=ENV, capture_output=True, timeout=20)
        if os.path.exists(SOCKET):
            os.unlink(SOCKET)
        try:
            os.killpg(cls.demo.pid, signal.SIGTERM)
            cls.demo.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(cls.demo.pid, signal.SIGKILL)
            cls.demo.wait()

    def start_top(self, session):
        """kvrail top in a fresh 120x40 session, after a line of its own on the main screen and
        before one saying how it ended."""
        command = "echo before top; %s top --endpoints %s --interval 1; echo \"top exited rc=$?\"; " \
                  "sleep 600" % (shlex.quote(KVRAIL), shlex.quote(self.endpoints))
        tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", command)
        return wait_for("%s: the first frame" % session,
                        lambda: (lambda t: ("q to quit" in t, t))(pane(session)), timeout=20)

    def assert_restored(self, session, how):
        text = wait_for("%s: the screen given back after %s" % (session, how),
                        lambda: (lambda t: ("top exited rc=0" in t, t))(pane(session)),
                        timeout=20)
        self.assertIn("before top", text)
        self.assertNotIn("q to quit", text)
        self.assertEqual(pane_flag(session, "alternate_on"), "0")
        self.assertEqual(pane_flag(session, "cursor_flag"), "1")

    def top_json(self):
        # A scrape of a sidecar under load in a sanitizer build can take longer than the
        # interval: the frame's numbers are what this checks, not how fast they came.
        done = subprocess.run([KVRAIL, "top", "--once", "--json", "--interval", "0.5",
                               "--timeout", "5", "--endpoints", self.endpoints],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        return {e["endpoint"]: e for e in json.loads(done.stdout)["endpoints"]}

    def test_1_the_live_view_as_a_person_sees_it(self):
        first = self.start_top("live")
        self.assertEqual(pane_flag("live", "alternate_on"), "1", first)
        self.assertEqual(pane_flag("live", "cursor_flag"), "0", first)
        roles = {"bootstrap": "bootstrap", "prefill-sidecar-0": "prefill",
                 "prefill-sidecar-1": "prefill", "decode-sidecar-0": "decode"}

        def moving():
            text = pane("live")
            found = rows(text)
            every = all(found.get(self.metrics[n], [None, None])[1] == r for n, r in roles.items())
            prefill = found.get(self.metrics["prefill-sidecar-0"], [])
            busy = len(prefill) > 4 and (number(prefill[3]) > 0 or number(prefill[4]) > 0)
            return every and busy, text
        text = wait_for("each endpoint's row, and a prefill with nonzero rooms/s or GB/s",
                        moving)
        self.assertIn("kvrail top  4 endpoints: 4 up, 0 down", text)
        self.assertIn("GB/s to/from this peer", text)
        for line in text.splitlines():
            self.assertLessEqual(len(line), 120)

        # --once --json against the same processes.
        frame = self.top_json()
        self.assertEqual(sorted(e["kind"] for e in frame.values()),
                         ["bootstrap", "sidecar", "sidecar", "sidecar"], frame)
        self.assertTrue(all(e["up"] and e["has_rates"] for e in frame.values()), frame)
        self.assertEqual(frame[self.metrics["bootstrap"]]["registered_ranks"], 2)
        self.assertEqual(frame[self.metrics["decode-sidecar-0"]]["role"], "decode")
        self.assertEqual(frame[self.metrics["prefill-sidecar-1"]]["rank"], "1")

        # A killed sidecar turns into a DOWN row with the error; the others stay.
        decode = self.metrics["decode-sidecar-0"]
        os.kill(listening_pid(int(decode.split(":")[1])), signal.SIGKILL)

        # A scrape in flight at the kill may first say "no answer within 1000 ms (httplib:
        # Read)"; the next one finds the port closed.
        def down():
            text = pane("live")
            found = rows(text)
            return (found.get(decode, [None, None])[1] == "DOWN" and
                    re.search(r"%s +DOWN +cannot reach it" % re.escape(decode), text) is not None
                    and found.get(self.metrics["prefill-sidecar-0"], [None, None])[1] == "prefill",
                    text)
        text = wait_for("the killed decode sidecar's DOWN row", down)
        self.assertRegex(text, r"%s +DOWN +cannot reach it" % re.escape(decode))
        self.assertIn("3 up, 1 down", text)
        frame = self.top_json()
        self.assertFalse(frame[decode]["up"])
        self.assertIn("cannot reach it", frame[decode]["error"])
        self.assertTrue(frame[self.metrics["prefill-sidecar-0"]]["up"])

        # A narrow terminal: the frame is redrawn at its size, every line cut, none wrapped.
        tmux("resize-window", "-t", "live", "-x", "60", "-y", "20")

        def narrow():
            text = pane("live")
            lines = [line for line in text.splitlines() if line.strip()]
            starts = ("kvrail top", "ENDPOINT", "127.0.0.1:", "  -> ", "20")
            return (len(lines) > 3 and lines[0].startswith("kvrail top  4 endpoints") and
                    "q to quit" in lines[-1] and
                    all(line.startswith(starts) and len(line) <= 60 for line in lines), text)
        wait_for("the frame cut to 60 columns, nothing wrapped", narrow, timeout=20)

        # q quits and gives the screen back.
        tmux("send-keys", "-t", "live", "q")
        self.assert_restored("live", "q")

    def test_2_ctrl_c_and_sigterm_give_the_screen_back(self):
        self.start_top("ctrl-c")
        tmux("send-keys", "-t", "ctrl-c", "C-c")
        self.assert_restored("ctrl-c", "Ctrl-C")

        self.start_top("term")
        shell = int(pane_flag("term", "pane_pid"))
        with open("/proc/%d/task/%d/children" % (shell, shell)) as children:
            top = int(children.read().split()[0])
        os.kill(top, signal.SIGTERM)
        self.assert_restored("term", "SIGTERM")


if __name__ == "__main__":
    unittest.main()
