"""What an engine is told when its sidecar goes away, and when it comes back (issue 15).

The client watches its connection to the sidecar (ZeroMQ heartbeats: a sidecar process that
died closes it at once, one that is stopped or cut off stops answering within the heartbeat
timeout). When it is lost, every room the engine began and that has not ended is reported
Failed by the client itself. Whether the room's pages may be reused then depends on the sidecar
process: once it is gone, nothing of its rooms can land (its registrations, queue pairs and
sockets went with it), so the pages are REUSABLE, proven; while it may still exist (stopped,
cut off, or in another pid namespace), a write might still land, so they are HELD. Held rooms
are settled when the connection comes back: if the process is gone by then (a restarted
sidecar), their pages are released, proven; if it is the same process, the client attaches its
arena again (with its engine token: a new connection is a new client to the sidecar), which
voids the rooms begun before, fenced (docs/ENGINE-API.md), and the sidecar's own outcomes then
release them.
"""

import os
from typing import Dict, List, Optional, Tuple

from kvrail_engine.room_event import Pages, RoomEvent, TransferPoll, failed

ACTIVE, HELD, ORPHANED = "active", "held", "orphaned"


def sidecar_process_gone(pid: int) -> Optional[bool]:
    """True when the sidecar process `pid` no longer exists (or the pid is another program's
    now), False while it does, None when unknown (no pid: the engine never attached)."""
    if not pid:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"sidecar" not in f.read()
    except OSError:
        return None


class RoomLedger:
    """The rooms an engine began on its sidecar that have not ended for it, with what it was
    told of their pages. Pure bookkeeping: the client feeds it requests and events."""

    def __init__(self) -> None:
        self._rooms: Dict[int, str] = {}  # room -> ACTIVE, HELD (Failed, pages held) or ORPHANED

    def __len__(self) -> int:
        return len(self._rooms)

    def state(self, room: int) -> Optional[str]:
        return self._rooms.get(room)

    def begun(self, room: int) -> None:
        """The sidecar accepted a request that starts (or continues) `room`."""
        self._rooms.setdefault(room, ACTIVE)

    def outcome(self, event: RoomEvent) -> Optional[RoomEvent]:
        """An event from the sidecar: what the engine should see of it (None: nothing, it was
        told already)."""
        state = self._rooms.get(event.room)
        if state is None:
            return event
        pages_free = (event.status == TransferPoll.SUCCESS or event.pages_released
                      or (event.status == TransferPoll.FAILED and event.pages != Pages.HELD))
        if state == ORPHANED:
            if not pages_free:
                return None  # still held, by the sidecar now: its release follows
            del self._rooms[event.room]
            return failed(event.room, "pages released: the sidecar ended the room (%s) after it "
                          "came back" % (event.reason or event.status.name), Pages.REUSABLE,
                          released=True,
                          proven=event.pages_proven or event.pages != Pages.HELD)
        if pages_free:
            del self._rooms[event.room]
        elif event.status == TransferPoll.FAILED:
            self._rooms[event.room] = HELD
        return event

    def lost(self, why: str, gone: Optional[bool]) -> List[RoomEvent]:
        """The connection to the sidecar is lost (`why`); `gone`: sidecar_process_gone's answer.
        The events to give the engine now."""
        events: List[RoomEvent] = []
        for room, state in sorted(self._rooms.items()):
            if state == ORPHANED:
                continue
            if gone:
                if state == ACTIVE:
                    events.append(failed(room, "%s; the sidecar process is gone, so nothing of "
                                         "the room can land" % why, Pages.REUSABLE))
                else:
                    events.append(failed(room, "pages released: the sidecar process is gone",
                                         Pages.REUSABLE, released=True, proven=True))
                del self._rooms[room]
            else:
                if state == ACTIVE:
                    events.append(failed(room, "%s; a write of the room may still land until "
                                         "the sidecar is back or known gone" % why, Pages.HELD))
                self._rooms[room] = ORPHANED
        return events

    def back(self, gone: Optional[bool]) -> Tuple[List[RoomEvent], List[int]]:
        """The connection came back; `gone`: whether the process the rooms were begun on is gone
        now. The events to give the engine now, and the rooms the sidecar must void (the same
        process: the client attaches again, and its outcomes release them through outcome())."""
        orphaned = sorted(room for room, state in self._rooms.items() if state == ORPHANED)
        if not gone:
            return [], orphaned
        events: List[RoomEvent] = []
        for room in orphaned:
            events.append(failed(room, "pages released: the sidecar that held the room is gone",
                                 Pages.REUSABLE, released=True, proven=True))
            del self._rooms[room]
        return events, []
