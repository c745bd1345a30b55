"""kvrail engine API client: drive a kvrail sidecar from an inference engine rank.

    from kvrail_engine import SidecarClient
    sidecar = SidecarClient("ipc:///tmp/kvrail-p0.sock")
    arena = sidecar.attach_allocated(arena_bytes, contract_json)  # arena.view: the KV pages
    sidecar.ready(room=7, source_manifest=manifest_json, bootstrap_token=42)
    event = sidecar.next_event(timeout=30.0)

See python/examples/engine_example.py and docs/ENGINE-API.md.
"""

import sys as _sys


def _check_requirements() -> None:
    """One line naming the Python to use when this one lacks what the client needs at run time
    (an offline install could not fetch them)."""
    import importlib.util

    def found(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            return False

    missing = [package for module, package in (("zmq", "pyzmq"), ("google.protobuf", "protobuf"))
               if not found(module)]
    if missing:
        raise ImportError(
            "kvrail_engine: this Python (%s) lacks %s: use Debian's /usr/bin/python3 "
            "(python3-zmq, python3-protobuf), or a venv made from it with --system-site-packages "
            "(python/README.md)" % (_sys.executable, ", ".join(missing)))


_check_requirements()

from kvrail_engine.client import SidecarArena, SidecarClient, SidecarError  # noqa: E402
from kvrail_engine.room_event import (SIDECAR_LOST, DecodeWindow, Pages, RoomEvent,  # noqa: E402
                                     RoomState, TransferPoll)

__all__ = ["DecodeWindow", "Pages", "RoomEvent", "RoomState", "SIDECAR_LOST", "SidecarArena",
           "SidecarClient", "SidecarError", "TransferPoll"]
