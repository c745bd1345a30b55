"""What a kvrail-backed tokenspeed executor does on both roles: one SidecarClient (the
scheduler thread's only), the requests' rooms, the sidecar's events read once per iteration,
the TP vote, and the sidecar's supervision.

tokenspeed's event loop calls the executor from its scheduler thread only: register(),
execute(), generate_events() every iteration, and the role's own calls (prefill.py,
decode.py). Each request's room ends for the scheduler with exactly one event: success, or
FailedEvent once no rank's pages of it can be written any more (kvrail's page rule,
docs/ENGINE-API.md "When pages are safe"), so tokenspeed, which frees a failed request's pages
at its FailedEvent, never frees pages a late write may still land in.
"""

import functools
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar, cast

from kvrail_engine import Pages, RoomEvent, SidecarClient, SidecarError, TransferPoll

from kvrail_tokenspeed.launcher import Supervised
from kvrail_tokenspeed.room import BOOTSTRAPPED, BOOTSTRAPPING, SUCCESS, Room
from kvrail_tokenspeed.vote import Local, Reduce, agree

logger = logging.getLogger("kvrail_tokenspeed")

# tokenspeed's Forward.Batch rows -> a CachePD block manifest (wire JSON) of request row `row`
# for the window [prefix_len, prompt_len): tokenspeed's build_cache_block_manifest.
ManifestBuilder = Callable[[Any, int, int, int], bytes]

RESTART_EVERY = 5.0  # seconds between starts of a sidecar whose process is gone

Call = TypeVar("Call", bound=Callable[..., Any])


def locked(method: Call) -> Call:
    """The method runs holding the connector's lock: the client and the rooms are used by one
    thread at a time (the scheduler thread, or the prefill's layer watcher, layers.py)."""

    @functools.wraps(method)
    def run(self: "Connector", *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return cast(Call, run)


class Connector:
    """The part both roles share. `client`: the rank's SidecarClient, already attached;
    `events`: tokenspeed_scheduler's PD module (its event classes); `manifest`: the
    ManifestBuilder; `reduce`: the TP group's vote (vote.gloo_min); `sidecar`: the process
    this rank started (None: the operator runs it); `attach`: shares the arena again with a
    sidecar that restarted."""

    role = ""

    def __init__(self, client: SidecarClient, events: Any, manifest: ManifestBuilder,
                 reduce: Reduce, sidecar: Optional[Supervised] = None,
                 attach: Optional[Callable[[], None]] = None) -> None:
        self.lock = threading.RLock()
        self.client = client
        self.events = events
        self.manifest = manifest
        self.reduce = reduce
        self.sidecar = sidecar
        self.attach = attach
        self.requests: Dict[str, Room] = {}  # by request id, in registration order
        self.rooms: Dict[int, Room] = {}  # the same, by room
        self.detached: Dict[int, str] = {}  # rooms begun for no request (an EPD abort)
        self._lost = False
        self._next_start = 0.0
        self._closed = False

    # The event loop's calls -------------------------------------------------------------------

    @locked
    def register(self, request_id: str, bootstrap_info: Any) -> None:
        """A request enters the scheduler, with tokenspeed's BootstrapInfo (bootstrap_host,
        bootstrap_port, bootstrap_room)."""
        room_id = bootstrap_info.bootstrap_room
        if isinstance(room_id, bool) or not isinstance(room_id, int) or not 0 <= room_id < 2**63:
            raise ValueError("kvrail: request %s: bootstrap_room %r is not a room id (an int "
                             "in [0, 2^63))" % (request_id, room_id))
        if request_id in self.requests:
            raise ValueError("kvrail: request %s is registered already (room %d)"
                             % (request_id, self.requests[request_id].room))
        if room_id in self.rooms:
            raise ValueError("kvrail: request %s: room %d is request %s's, which has not ended"
                             % (request_id, room_id, self.rooms[room_id].request_id))
        room = Room(request_id, room_id, "%s:%s" % (bootstrap_info.bootstrap_host,
                                                    bootstrap_info.bootstrap_port))
        self.requests[request_id] = room
        self.rooms[room_id] = room
        self.admit(room)

    @locked
    def generate_events(self) -> List[Any]:
        """This iteration's room events for the scheduler, the same on every TP rank."""
        self.progress()
        for event in self.client.drain_events():
            self.take(event)
        self.supervise()
        if not self.requests:
            return []
        rooms = list(self.requests.values())
        agreed = agree([Local(r.status, r.failed, r.unsafe) for r in rooms], self.reduce)
        out: List[Any] = []
        for room, group in zip(rooms, agreed):
            if group.failed:
                if not room.failed:
                    room.fail("another TP rank failed the room")
                if room.in_flight and not room.aborting:
                    self.abort_room(room, room.reason)
                if not group.unsafe:
                    logger.warning("kvrail: request %s (room %d) failed: %s", room.request_id,
                                   room.room, room.reason)
                    out.append(self.events.FailedEvent(room.request_id))
                    self.drop(room)
            elif group.status == SUCCESS and room.shown == BOOTSTRAPPED:
                success = self.succeeded(room)
                if success is None:
                    room.fail("its Success cannot be handed to the scheduler")
                else:
                    out.append(success)
                    self.drop(room)
            elif group.status >= BOOTSTRAPPED and room.shown == BOOTSTRAPPING:
                room.shown = BOOTSTRAPPED
                out.append(self.events.BootstrappedEvent(room.request_id))
        return out

    @locked
    def abort(self, request_id: str, bootstrap_info: Any = None,
              reason: str = "aborted by the engine") -> None:
        """Gives a request's room up: fenced through kvrail; its FailedEvent follows once its
        pages are safe. A prefill request never registered (tokenspeed's EPD abort) is begun
        and aborted, so that its decodes are told Failed."""
        room = self.requests.get(request_id)
        if room is not None:
            room.fail("%s: %s" % (request_id, reason))
            if room.in_flight and not room.aborting:
                self.abort_room(room, reason)
            return
        if bootstrap_info is not None and self.role == "prefill":
            room_id = bootstrap_info.bootstrap_room
            try:
                self.client.begin(room_id)
                self.client.abort(room_id, "%s: %s" % (request_id, reason))
                self.detached[room_id] = request_id
            except SidecarError as error:
                logger.warning("kvrail: abort of request %s (room %d): %s", request_id,
                               room_id, error)

    @locked
    def close(self) -> None:
        """Shutdown: the rooms in flight are aborted, the client closed, the sidecar this rank
        started stopped."""
        if self._closed:
            return
        self._closed = True
        for room in self.requests.values():
            if room.in_flight and not room.aborting:
                self.abort_room(room, "the tokenspeed rank is shutting down")
        self.client.close()
        if self.sidecar is not None:
            self.sidecar.stop()

    # What each role adds -----------------------------------------------------------------------

    def admit(self, room: Room) -> None:
        raise NotImplementedError

    def succeeded(self, room: Room) -> Optional[Any]:
        """The scheduler's event for a room every rank finished; None to fail it instead."""
        raise NotImplementedError

    def progress(self) -> None:
        """Work due before the iteration's events (prefill: layers the forward finished)."""

    # Shared ------------------------------------------------------------------------------------

    def call(self, room: Room, what: str, request: Callable[[], Any]) -> bool:
        """A request of `room` to the sidecar: False, with the room failed here naming the
        refusal, when the sidecar refuses it (a refusal changes nothing: a room the sidecar
        has in flight stays so until its terminal event)."""
        try:
            request()
            return True
        except SidecarError as error:
            room.fail("%s refused: %s" % (what, error))
            return False

    def abort_room(self, room: Room, reason: str) -> None:
        room.aborting = True
        try:
            self.client.abort(room.room, reason)
        except SidecarError as error:  # it ended meanwhile, or the sidecar is lost
            logger.info("kvrail: abort of room %d: %s", room.room, error)

    def take(self, event: RoomEvent) -> None:
        """One event from the sidecar (through the client's room ledger)."""
        room = self.rooms.get(event.room)
        if room is None:
            if event.status in (TransferPoll.SUCCESS, TransferPoll.FAILED):
                self.detached.pop(event.room, None)
            return
        if event.status == TransferPoll.PAGES_RELEASED or event.pages_released:
            room.held = False
            if not event.pages_proven:
                logger.warning("kvrail: room %d's pages released unproven: %s", room.room,
                               event.reason)
        elif event.status == TransferPoll.FAILED:
            room.in_flight = False
            room.held = event.pages == Pages.HELD
            room.fail("%s (%s)" % (event.reason, event.cause) if event.cause else event.reason)
        elif event.status == TransferPoll.SUCCESS:
            room.in_flight = False
            self.landed(room, event)
        elif event.status == TransferPoll.BOOTSTRAPPED:
            self.bootstrapped(room, event)

    def landed(self, room: Room, event: RoomEvent) -> None:
        if not room.failed:
            room.status = SUCCESS

    def bootstrapped(self, room: Room, event: RoomEvent) -> None:
        pass

    def drop(self, room: Room) -> None:
        del self.requests[room.request_id]
        del self.rooms[room.room]

    def supervise(self) -> None:
        """A sidecar lost: said once; one this rank started whose process is gone is started
        again (at most every RESTART_EVERY seconds); a sidecar that came back as another
        process is given the arena again."""
        lost = self.client.sidecar_lost
        if lost is not None and not self._lost:
            self._lost = True
            logger.error("kvrail: %s; every room in flight fails", lost)
        if self.sidecar is not None and self.sidecar.exited() is not None:
            now = time.monotonic()
            if now >= self._next_start:
                self._next_start = now + RESTART_EVERY
                logger.error("%s; starting it again", self.sidecar.exited())
                try:
                    self.sidecar.start()
                except RuntimeError as error:
                    logger.error("%s", error)
        if self._lost and lost is None and self.attach is not None:
            try:
                if int(self.client.stats()["pid"]) != self.client.sidecar_pid:
                    self.attach()
                self._lost = False
                logger.warning("kvrail: the sidecar is back (pid %d)", self.client.sidecar_pid)
            except (SidecarError, RuntimeError) as error:
                logger.info("kvrail: the sidecar is not back yet: %s", error)
