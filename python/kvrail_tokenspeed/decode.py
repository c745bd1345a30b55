"""The decode rank's executor logic over kvrail (tokenspeed's DisaggDecodeExecutor calls).

register: the room is known; kvrail's decode has no bootstrapping the engine sees (its sidecar
fetches the route at the room's Expect), so the scheduler is told Bootstrapped at the next
iteration and allocates the pages. execute (the admission batch): Expect with the window's
destination manifest. Success carries the first token, the speculative ids, and (CachePD
2026-09) the prefill's cached tokens and the first token's log-probability; the scheduler sees
RemotePrefillDoneEvent. A Failed room's FailedEvent waits until its pages are safe (a Failed
with pages HELD: its PAGES_RELEASED notice), because tokenspeed frees them at that event.
"""

from functools import partial
from typing import Any, Dict, List, Optional, Tuple

from kvrail_engine import RoomEvent

from kvrail_tokenspeed.connector import Connector
from kvrail_tokenspeed.room import BOOTSTRAPPED, SUCCESS, TRANSFERRING, Room


class DecodeConnector(Connector):
    role = "decode"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._remote_cache_slots: Dict[str, int] = {}
        self._remote_spec_candidate_ids: Dict[str, Tuple[int, List[int]]] = {}
        self._remote_extras: Dict[str, Tuple[int, Optional[float]]] = {}

    # tokenspeed's calls ------------------------------------------------------------------------

    def execute(self, op: Any) -> None:
        """The admission batch: the pages of each new request are allocated; Expect."""
        extends = op.num_extends()
        if extends != len(op.request_ids):
            raise RuntimeError("kvrail: decode admission does not support mixed batches "
                               "(%d extends of %d rows)" % (extends, len(op.request_ids)))
        for row, request_id in enumerate(op.request_ids):
            room = self.requests.get(request_id)
            if room is None or room.failed or room.pool_index is not None:
                continue
            prefix_len = int(op.extend_prefix_lens[row])
            prompt_len = int(op.prefill_lengths[row])
            room.window = (prefix_len, prompt_len)
            room.pool_index = int(op.request_pool_indices[row])
            try:
                manifest = self.manifest(op, row, prefix_len, prompt_len)
            except ValueError as error:
                room.fail("its destination manifest: %s" % error)
                continue
            if self.call(room, "Expect", partial(self.client.expect, room.room, room.bootstrap,
                                                 destination_manifest=manifest)):
                room.in_flight = True
                room.status = TRANSFERRING

    def pop_remote_spec_candidate_ids(self, request_id: str) -> Optional[Tuple[int, List[int]]]:
        return self._remote_spec_candidate_ids.pop(request_id, None)

    def pop_remote_cache_slot(self, request_id: str) -> Optional[int]:
        return self._remote_cache_slots.pop(request_id, None)

    def pop_remote_prefill_extras(self, request_id: str) -> Optional[Tuple[int, Optional[float]]]:
        """(cached_tokens, first_token_logprob) of a request whose RemotePrefillDoneEvent was
        emitted: what kvrail's Success carries beyond tokenspeed's event (CachePD 2026-09)."""
        return self._remote_extras.pop(request_id, None)

    # Connector's ---------------------------------------------------------------------------------

    def admit(self, room: Room) -> None:
        lost = self.client.sidecar_lost
        if lost is not None:  # its Expect would be refused: no pages for it
            room.fail(lost)
        else:
            room.status = BOOTSTRAPPED

    def landed(self, room: Room, event: RoomEvent) -> None:
        if room.failed:
            return
        if event.bootstrap_token < 0:
            room.fail("kvrail's Success carried no bootstrap token")
            return
        room.status = SUCCESS
        room.token = event.bootstrap_token
        room.speculative_ids = list(event.speculative_ids)
        room.cached_tokens = event.cached_tokens
        room.first_token_logprob = event.first_token_logprob

    def succeeded(self, room: Room) -> Optional[Any]:
        if room.pool_index is None:  # cannot be: Success follows an Expect
            return None
        self._remote_cache_slots[room.request_id] = room.pool_index
        if room.speculative_ids:
            self._remote_spec_candidate_ids[room.request_id] = (room.pool_index,
                                                                room.speculative_ids)
        self._remote_extras[room.request_id] = (room.cached_tokens, room.first_token_logprob)
        return self.events.RemotePrefillDoneEvent(room.request_id, room.token)
