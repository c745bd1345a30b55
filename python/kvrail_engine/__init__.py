"""kvrail engine API client: drive a kvrail sidecar from an inference engine rank.

    from kvrail_engine import SidecarClient
    sidecar = SidecarClient("ipc:///tmp/kvrail-p0.sock")
    arena = sidecar.attach_allocated(arena_bytes, contract_json)  # arena.view: the KV pages
    sidecar.ready(room=7, source_manifest=manifest_json, bootstrap_token=42)
    event = sidecar.next_event(timeout=30.0)

See python/examples/engine_example.py and docs/ENGINE-API.md.
"""

from kvrail_engine.client import SidecarArena, SidecarClient, SidecarError
from kvrail_engine.room_event import (SIDECAR_LOST, DecodeWindow, Pages, RoomEvent, RoomState,
                                     TransferPoll)

__all__ = ["DecodeWindow", "Pages", "RoomEvent", "RoomState", "SIDECAR_LOST", "SidecarArena",
           "SidecarClient", "SidecarError", "TransferPoll"]
