"""Layer-wise sending while the forward pass runs.

tokenspeed's attention backend counts producer steps (one per layer) on the GPU into a host
counter (StepCounter) while the scheduler thread is elsewhere: it calls the executor only
before the forward (prepare_prefill) and after it (store_prefill_token, execute). A thread of
the executor's, this watcher, polls the counter while a room's last chunk is in its forward
pass and says each finished layer final (the prefill connector's progress(): LayersReady).

The SidecarClient is not thread-safe: the watcher and the scheduler thread use it, and the
rooms, only under the connector's one lock (connector.locked), so that at any moment one
thread drives the client.
"""

import threading
from typing import Callable

POLL_SECONDS = 0.0002  # tokenspeed's Mooncake sender polls its step counter every 100 us


class LayerWatcher:
    """Calls `progress()` every POLL_SECONDS while `busy()` says a room waits for layers;
    sleeps until `wake()` otherwise."""

    def __init__(self, progress: Callable[[], None], busy: Callable[[], bool]) -> None:
        self._progress = progress
        self._busy = busy
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kvrail-layers", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop:
            if self._busy():
                self._progress()
                self._wake.wait(POLL_SECONDS)
            else:
                self._wake.wait()
            self._wake.clear()
