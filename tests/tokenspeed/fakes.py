"""Fakes shaped like what a kvrail_tokenspeed connector talks to, for the unit tests: a
SidecarClient that records requests and hands out the events a test queues, tokenspeed's
events and forward batches (stubs/tokenspeed_scheduler.py, this project's own), and a
manifest builder."""

import json
import os
import sys
from typing import Any, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs"))

from kvrail_engine import DecodeWindow, Pages, RoomEvent, SidecarError, TransferPoll  # noqa: E402
from tokenspeed_scheduler import PD, Forward  # noqa: E402,F401


class FakeClient:
    """Records each request as (name, room, details); `refuse` names requests to refuse."""

    def __init__(self) -> None:
        self.calls: List[tuple] = []
        self.events: List[RoomEvent] = []
        self.refuse: set = set()
        self.sidecar_lost: Optional[str] = None
        self.sidecar_pid = 100
        self.pid_now = 100
        self.closed = False

    def _call(self, name: str, room: int, **details: Any) -> None:
        if self.sidecar_lost is not None:
            raise SidecarError(self.sidecar_lost)
        if name in self.refuse:
            raise SidecarError("%s of room %d refused" % (name, room))
        self.calls.append((name, room, details))

    def begin(self, room: int) -> None:
        self._call("begin", room)

    def ready(self, room: int, **details: Any) -> None:
        self._call("ready", room, **details)

    def layers_ready(self, room: int, layers: int, source_manifest: Any = "") -> None:
        self._call("layers_ready", room, layers=layers, source_manifest=source_manifest)

    def expect(self, room: int, bootstrap_address: str, **details: Any) -> None:
        self._call("expect", room, bootstrap=bootstrap_address, **details)

    def abort(self, room: int, reason: str = "") -> None:
        self._call("abort", room, reason=reason)

    def stats(self) -> dict:
        if self.sidecar_lost is not None:
            raise SidecarError(self.sidecar_lost)
        return {"pid": self.pid_now}

    def drain_events(self) -> List[RoomEvent]:
        events, self.events = self.events, []
        return events

    def close(self) -> None:
        self.closed = True

    def named(self, name: str) -> List[tuple]:
        return [call for call in self.calls if call[0] == name]


def event(room: int, status: TransferPoll, **fields: Any) -> RoomEvent:
    values = dict(reason="", bootstrap_token=-1, speculative_ids=[], bytes=0, copies=0,
                  seconds=0.0)
    values.update(fields)
    return RoomEvent(room, status, **values)


def bootstrapped(room: int, *windows: tuple) -> RoomEvent:
    return event(room, TransferPoll.BOOTSTRAPPED, windows=tuple(
        DecodeWindow("s%d" % i, i, prefix, prompt) for i, (prefix, prompt) in enumerate(windows)))


def failed(room: int, pages: Pages = Pages.REUSABLE, reason: str = "it failed") -> RoomEvent:
    return event(room, TransferPoll.FAILED, reason=reason, pages=pages, cause="aborted")


def released(room: int) -> RoomEvent:
    return event(room, TransferPoll.PAGES_RELEASED, pages=Pages.REUSABLE, pages_released=True,
                 pages_proven=True)


def manifest(op: Any, row: int, prefix_len: int, prompt_len: int) -> bytes:
    """A stand-in for tokenspeed's build_cache_block_manifest: the row's blocks of the window."""
    table = op.block_tables_arrays()["full_attention"][row]
    blocks = table[prefix_len // 16:-(-prompt_len // 16)]
    return json.dumps({"groups": [{"group_id": "full_attention", "block_ids": blocks}],
                       "prefix_len": prefix_len, "prompt_len": prompt_len}).encode()


class Info:
    """tokenspeed's BootstrapInfo."""

    def __init__(self, room: int, host: str = "10.0.0.1", port: int = 8998) -> None:
        self.bootstrap_room = room
        self.bootstrap_host = host
        self.bootstrap_port = port


class FakeSidecar:
    """launcher.Supervised's supervision calls."""

    def __init__(self) -> None:
        self.gone: Optional[str] = None
        self.starts = 0
        self.stopped = False

    def exited(self) -> Optional[str]:
        return self.gone

    def start(self) -> str:
        self.starts += 1
        self.gone = None
        return "sidecar ready"

    def stop(self) -> None:
        self.stopped = True


class StepCounter:
    """tokenspeed's StepCounter interface on the CPU (its own needs CUDA): a forward pass
    records one producer step per layer it finished."""

    def __init__(self) -> None:
        self.cache_step = 0
        self.ready = 0

    def current_step(self) -> tuple:
        return self.cache_step, 0

    def advance_step(self, delta_cache_step: int, delta_aux_step: int) -> None:
        self.cache_step += delta_cache_step

    def record_cache(self) -> None:
        self.ready += 1

    def query_ready_cache_step(self) -> int:
        return self.ready
