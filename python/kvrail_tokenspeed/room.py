"""One tokenspeed request's kvrail room, as its executor tracks it on one rank."""

from typing import List, Optional, Tuple

# tokenspeed's TransferPoll codes (runtime/pd/base/status.py), which its scheduler's events and
# the TP vote speak.
FAILED, BOOTSTRAPPING, BOOTSTRAPPED, WAITING_FOR_INPUT, TRANSFERRING, SUCCESS = range(6)


class Room:
    """A request's room on this rank: its state here (`status`, a tokenspeed TransferPoll
    code), what the scheduler was told (`shown`), and whether a write of it may still land in
    this rank's pages (`unsafe`: the sidecar has it in flight, or it failed with its pages
    held until their release notice)."""

    def __init__(self, request_id: str, room: int, bootstrap: str) -> None:
        self.request_id = request_id
        self.room = room
        self.bootstrap = bootstrap  # the prefill node's bootstrap server, host:port
        self.status = BOOTSTRAPPING
        self.shown = BOOTSTRAPPING
        self.reason = ""
        self.in_flight = False  # the sidecar accepted a request of it and has not ended it
        self.held = False  # Failed with its pages held: wait for PAGES_RELEASED
        self.aborting = False
        # The decode's window [prefix_len, prompt_len) (a prefill learns it when Bootstrapped).
        self.window: Optional[Tuple[int, int]] = None
        self.dummy = False  # a prefill rank no decode rank reads (its BOOTSTRAPPED: no window)
        self.token = -1
        self.speculative_ids: Optional[List[int]] = None
        self.cached_tokens = 0
        self.first_token_logprob: Optional[float] = None
        # Prefill, layer-wise: the forward's first producer step, the layers said final, the
        # manifest given with the first LayersReady.
        self.first_step: Optional[int] = None
        self.layers_sent = 0
        self.manifest = b""
        self.readied = False
        self.seen_extend = False
        # Decode: the request pool slot the pages were allocated for.
        self.pool_index: Optional[int] = None

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    @property
    def unsafe(self) -> bool:
        return self.in_flight or self.held

    def fail(self, reason: str) -> None:
        """The room failed here (the first reason is kept)."""
        if self.status != FAILED:
            self.status = FAILED
            self.reason = reason
