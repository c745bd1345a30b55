"""The kvrail processes a tokenspeed deployment runs: a rank's sidecar, and a prefill node's
bootstrap server (which tokenspeed starts in place of Mooncake's, get_kv_class's
BOOTSTRAP_SERVER).

Each is started with its ready line awaited (the first stdout line, "sidecar ready ..." or
"bootstrap ready ..."), its stderr in a log file, and is supervised: `exited()` says, in one
line, when and how it ended; the connector starts a sidecar again when its process is gone
(docs/TOKENSPEED.md, "A lost sidecar").
"""

import atexit
import os
import select
import subprocess
import time
from typing import IO, List, Optional

from kvrail_tokenspeed import settings


class LaunchError(RuntimeError):
    """A kvrail process did not start: the message says which, and why."""


class Supervised:
    """One kvrail process started from `argv`, ready once its first stdout line starts with
    `ready` (within `timeout` seconds); its stderr goes to `log_path`."""

    def __init__(self, argv: List[str], ready: str, log_path: str, timeout: float = 30.0) -> None:
        self.argv = list(argv)
        self.ready = ready
        self.log_path = log_path
        self.timeout = timeout
        self.ready_line = ""
        self.starts = 0
        self._process: Optional["subprocess.Popen[str]"] = None
        self._log: Optional[IO[str]] = None
        atexit.register(self.stop)

    @property
    def pid(self) -> int:
        return self._process.pid if self._process is not None else 0

    def start(self) -> str:
        """Starts the process and returns its ready line; LaunchError naming the command, its
        exit and its log when it ends or says nothing in time."""
        self.stop()
        try:
            self._log = open(self.log_path, "a")
            self._process = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                              stderr=self._log, text=True,
                                              start_new_session=True)
        except OSError as error:
            raise LaunchError("kvrail: cannot run %s: %s (set KVRAIL_BIN to the kvrail binary)"
                              % (self.argv[0], error.strerror))
        self.starts += 1
        assert self._process.stdout is not None
        readable, _, _ = select.select([self._process.stdout], [], [], self.timeout)
        line = self._process.stdout.readline() if readable else ""
        if not line.startswith(self.ready):
            self.stop()
            raise LaunchError("kvrail: `%s` did not say %r within %.0f s (%s); its log: %s"
                              % (" ".join(self.argv[:3]), self.ready, self.timeout,
                                 "it said %r" % line.strip() if line else "it said nothing",
                                 self.log_path))
        self.ready_line = line.strip()
        return self.ready_line

    def exited(self) -> Optional[str]:
        """None while the process runs; once it ended, one line saying how."""
        if self._process is None:
            return "kvrail: %s was never started" % self.argv[:2]
        code = self._process.poll()
        if code is None:
            return None
        how = "killed by signal %d" % -code if code < 0 else "exited with status %d" % code
        return "kvrail: %s (pid %d) %s; its log: %s" % (" ".join(self.argv[:2]),
                                                       self._process.pid, how, self.log_path)

    def stop(self) -> None:
        """Stops the process (SIGTERM, then SIGKILL after 10 s) if it runs."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                if not gone_within(process, 10.0):
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


def ready_field(line: str, key: str) -> str:
    """The value of `key=value` among a ready line's words; "" when none."""
    for word in line.split():
        if word.startswith(key + "="):
            return word[len(key) + 1:]
    return ""


class KvrailBootstrapServer:
    """tokenspeed's BOOTSTRAP_SERVER for the kvrail backend: `kvrail bootstrap --port <port>`,
    started when tokenspeed's prefill front end makes it (async_llm.py) and stopped at exit.
    The prefill ranks' sidecars register with it; decode sidecars ask it for routes."""

    def __init__(self, port: int, host: str = "") -> None:
        argv = [settings.kvrail_binary(os.environ), "bootstrap", "--port", str(port)]
        if host:
            argv += ["--host", host]
        log = os.path.join(settings.log_dir(os.environ), "kvrail-bootstrap-%d-%d.log"
                           % (os.getpid(), port))
        self.process = Supervised(argv, "bootstrap ready", log)
        self.process.start()
        self.port = int(ready_field(self.process.ready_line, "port") or port)

    def close(self) -> None:
        self.process.stop()


def gone_within(process: "subprocess.Popen[str]", seconds: float) -> bool:
    """Whether `process` exits within `seconds`."""
    deadline = time.monotonic() + seconds
    while process.poll() is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
