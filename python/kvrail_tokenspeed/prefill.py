"""The prefill rank's executor logic over kvrail (tokenspeed's DisaggPrefillExecutor calls).

register -> begin(room): the room exists; kvrail's BOOTSTRAPPED event (every decode rank
pre-allocated it) carries the decodes' window, and only then does the scheduler see
BootstrappedEvent and run the forward pass. prepare_prefill (every extend batch): the prefill's
own cached prefix (cached_tokens), and with layer-wise sending the last chunk's producer steps;
as the forward pass finishes layers, LayersReady. store_prefill_token: the first token and
speculative ids. execute (the batch after the forward): Ready with the window's manifest.
"""

from functools import partial
from typing import Any, List, Optional, Sequence

from kvrail_engine import RoomEvent

from kvrail_tokenspeed.connector import Connector, locked
from kvrail_tokenspeed.layers import LayerWatcher
from kvrail_tokenspeed.room import BOOTSTRAPPED, FAILED, TRANSFERRING, Room

COUNT_NUM_MAX = 2**62  # tokenspeed's StepCounter wraps its steps at this


def layer_of(field_id: str) -> int:
    """The model layer of a contract field id, layer.<N>.<suffix> (tokenspeed's and kvrail's
    rule for layer-wise fields); ValueError naming the field otherwise."""
    parts = field_id.split(".", 2)
    if len(parts) != 3 or parts[0] != "layer" or not parts[1].isdigit():
        raise ValueError("kvrail: cache field %r is not layer.<N>.<suffix>: layer-wise "
                         "sending needs every field owned by a layer" % field_id)
    return int(parts[1])


def layers_final(fields_by_step: Sequence[Sequence[str]]) -> List[int]:
    """For k = 0..steps: the L of LayersReady once the forward finished its first k producer
    steps: every layer below the lowest layer a later step still writes."""
    out: List[int] = []
    all_layers = [layer_of(f) for step in fields_by_step for f in step]
    top = max(all_layers) + 1 if all_layers else 0
    for k in range(len(fields_by_step) + 1):
        later = [layer_of(f) for step in fields_by_step[k:] for f in step]
        out.append(min(later) if later else top)
    return out


class PrefillConnector(Connector):
    """A prefill rank of DP group `dp_rank` of `dp_size` (CachePD routes room r to group
    r mod dp_size: a request routed to another group is failed at register, naming both)."""

    role = "prefill"

    def __init__(self, *args: Any, dp_size: int = 1, dp_rank: int = 0,
                 producer_steps: Optional[Sequence[Sequence[str]]] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dp_size = dp_size
        self.dp_rank = dp_rank
        self.producer_steps = producer_steps
        self.step_counter: Any = None
        self.interval = 1
        self._final: List[int] = []
        self.watcher: Optional[LayerWatcher] = None
        self.layers_ready_calls = 0  # LayersReady requests made (for tests and logs)

    # tokenspeed's calls ------------------------------------------------------------------------

    @locked
    def register_layerwise_step_counter(self, step_counter: Any, interval: int) -> None:
        """Layer-wise sending (tokenspeed's default, interval 1): the attention backend counts
        producer steps on `step_counter`; every `interval` layers the forward finished are
        said final (LayersReady)."""
        if self.producer_steps is None:
            raise ValueError("kvrail: layer-wise sending needs the cache producer schedule "
                             "(KVArgs.cache_producer_schedule)")
        self._final = layers_final(self.producer_steps)
        self.step_counter = step_counter
        self.interval = max(int(interval), 1)
        if self.watcher is None:
            self.watcher = LayerWatcher(self.progress, self.streaming)

    @locked
    def prepare_prefill(self, op: Any) -> None:
        """Before an extend batch's forward pass."""
        extends = op.num_extends()
        if extends == 0:
            return
        first_step = None
        if self.step_counter is not None:
            # One producer range per forward, as the attention backend records one.
            first_step, _ = self.step_counter.current_step()
            self.step_counter.advance_step(len(self.producer_steps or ()), 0)
        for row, request_id in enumerate(op.request_ids[:extends]):
            room = self.requests.get(request_id)
            if room is None or room.failed:
                continue
            begin = int(op.extend_prefix_lens[row])
            if not room.seen_extend:
                room.seen_extend = True
                room.cached_tokens = begin  # served from this prefill's own prefix cache
            if first_step is None or room.window is None:
                continue
            prefix_len, prompt_len = room.window
            end = begin + int(op.input_lengths[row])
            if end > prompt_len:
                room.fail("prefill chunk [%d, %d) extends past the decode's prompt_len %d"
                          % (begin, end, prompt_len))
            elif end == prompt_len:  # the last chunk: its forward finishes every layer
                room.first_step = first_step
                room.manifest = self.manifest(op, row, prefix_len, prompt_len)
                if self.watcher is not None:
                    self.watcher.wake()

    @locked
    def store_prefill_token(self, request_id: str, aux_index: int, token: int,
                            spec_candidate_ids: Optional[List[int]] = None,
                            first_token_logprob: Optional[float] = None) -> None:
        """After the forward pass: the request's first output token (and speculative ids)."""
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError("kvrail: request %s: the bootstrap token %r must be an int >= 0"
                             % (request_id, token))
        room = self.requests.get(request_id)
        if room is None:
            return
        room.token = token
        room.speculative_ids = list(spec_candidate_ids) if spec_candidate_ids else None
        room.first_token_logprob = first_token_logprob
        self.progress()

    @locked
    def execute(self, op: Any) -> None:
        """The batch after the forward pass: each room's cache is final; Ready."""
        self.progress()
        for row, request_id in enumerate(op.request_ids):
            room = self.requests.get(request_id)
            if room is None or room.failed or room.readied:
                continue
            if room.window is None and not room.dummy:
                room.fail("the forward pass ran before kvrail's BOOTSTRAPPED")
                continue
            if room.token < 0:
                room.fail("no bootstrap token was stored before the room's Ready")
                continue
            # A dummy rank (no decode reads it, CachePD's idle ranks) readies its token only.
            prefix_len, prompt_len = room.window or (0, 0)
            manifest = b""
            if not room.layers_sent and not room.dummy:
                manifest = self.manifest(op, row, prefix_len, prompt_len)
            room.readied = True
            if self.call(room, "Ready", partial(
                    self.client.ready, room.room, source_manifest=manifest,
                    bootstrap_token=room.token, speculative_ids=room.speculative_ids or (),
                    cached_tokens=min(room.cached_tokens, prompt_len),
                    # (a dummy's prompt_len is 0: it reports no cached tokens)
                    first_token_logprob=room.first_token_logprob)):
                room.status = TRANSFERRING

    # Connector's ---------------------------------------------------------------------------------

    def admit(self, room: Room) -> None:
        if room.room % self.dp_size != self.dp_rank:
            room.fail("room %d belongs to prefill DP group %d (room mod dp_size %d), not this "
                      "rank's group %d: route requests by room mod the prefill DP size"
                      % (room.room, room.room % self.dp_size, self.dp_size, self.dp_rank))
            return
        if self.call(room, "Begin", partial(self.client.begin, room.room)):
            room.in_flight = True

    def bootstrapped(self, room: Room, event: RoomEvent) -> None:
        windows = {(w.prefix_len, w.prompt_len) for w in event.windows}
        if not windows and room.status != FAILED:  # a dummy rank: no decode reads its pages
            room.dummy = True
            room.status = BOOTSTRAPPED
        elif len(windows) != 1:
            room.fail("the decode ranks' windows disagree: %s" % sorted(windows))
        elif room.status != FAILED:
            room.window = windows.pop()
            room.status = BOOTSTRAPPED

    def succeeded(self, room: Room) -> Optional[Any]:
        return self.events.SucceededEvent(room.request_id)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        super().close()

    def streaming(self) -> bool:
        """Whether a room's last chunk is in its forward pass: layers to watch for."""
        with self.lock:
            return any(r.first_step is not None and not r.readied and not r.failed
                       for r in self.requests.values())

    @locked
    def progress(self) -> None:
        """LayersReady for the layers the forward finished (every `interval` of them)."""
        if self.step_counter is None:
            return
        done: Optional[int] = None
        for room in self.requests.values():
            if room.first_step is None or room.readied or room.failed:
                continue
            if done is None:
                done = self.step_counter.query_ready_cache_step()
            steps = (done - room.first_step) % COUNT_NUM_MAX
            if steps > COUNT_NUM_MAX // 2:  # not reached yet
                steps = 0
            steps = min(steps, len(self._final) - 1)
            layers = self._final[steps]
            if steps < len(self._final) - 1:
                layers -= layers % self.interval
            if layers > room.layers_sent:
                manifest = b"" if room.layers_sent else room.manifest
                self.layers_ready_calls += 1
                if self.call(room, "LayersReady", partial(
                        self.client.layers_ready, room.room, layers, source_manifest=manifest)):
                    room.layers_sent = layers
