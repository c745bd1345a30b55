"""The engine side of proto/kvrail/v1/engine.proto over ZeroMQ (python3-zmq, python3-protobuf).

One DEALER socket to the sidecar's ROUTER. Every request gets exactly one reply with the same
request_id; room outcomes (RoomEvent) arrive on the same socket at any time and are queued
until next_event() or drain_events() takes them. A scheduler loop calls drain_events() once per
iteration: it returns at once. Not thread-safe: use one client per thread.
"""

import collections
import importlib.util
import itertools
import json
import math
import mmap
import os
import subprocess
import time
import types
from typing import (TYPE_CHECKING, Any, Deque, Dict, Iterable, List, Optional, Sequence,
                    Tuple, Union)

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvrail_engine.liveness import RoomLedger, sidecar_process_gone
from kvrail_engine.room_event import (DecodeWindow, Pages, RoomEvent, RoomState,  # noqa: F401
                                     TransferPoll)

if TYPE_CHECKING:  # the generated module's types (engine_pb2.pyi, installed with the package)
    from kvrail_engine import engine_pb2 as _pb

# What the engine hands over as JSON text (a contract, a manifest): str or UTF-8 bytes.
Text = Union[str, bytes, bytearray]
# Block ids per KV cache group, in the contract's group order.
BlockTables = Sequence[Sequence[int]]


def _load_engine_pb2() -> types.ModuleType:
    """The generated engine API module: the one built beside this package (Bazel puts it in
    runfiles), or else generated once from proto/kvrail/v1/engine.proto with Debian's protoc
    into ~/.cache/kvrail/python."""
    try:
        from kvrail_engine import engine_pb2  # pylint: disable=import-outside-toplevel
        return engine_pb2
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    proto_root = os.path.join(here, "..", "..", "proto")
    proto = os.path.join(proto_root, "kvrail", "v1", "engine.proto")
    out = os.path.join(os.path.expanduser("~"), ".cache", "kvrail", "python")
    generated = os.path.join(out, "kvrail", "v1", "engine_pb2.py")
    if not os.path.exists(generated) or os.path.getmtime(generated) < os.path.getmtime(proto):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["/usr/bin/protoc", "--proto_path=" + proto_root, "--python_out=" + out,
                        proto], check=True)
    spec = importlib.util.spec_from_file_location("kvrail_engine_pb2", generated)
    assert spec is not None and spec.loader is not None, generated
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


engine_pb2: Any = _load_engine_pb2()


# TransferPoll by wire value: an index is cheaper than the enum's constructor, per room per poll.
_POLL = tuple(TransferPoll(value) for value in range(len(TransferPoll)))
_ENDED = (TransferPoll.SUCCESS, TransferPoll.FAILED)


class SidecarError(RuntimeError):
    """The sidecar refused a request (the message names the input and the rule it broke), or
    did not answer in time."""


class SidecarArena:
    """The KV arena a sidecar allocated (AttachArena.allocate_bytes), mapped into this process.

    `view` is a writable memoryview of exactly the arena's bytes (`length` of them, starting
    `offset` bytes into the file at `path`): the same pages the sidecar registered with its data
    plane. `placement` says where the sidecar's transport put them ("ucx-shm": UCX's own
    shared-memory segment, which its peers on this host fill with plain stores; "memfd"). The
    mapping outlives the sidecar; close() unmaps it (drop other views of it first).
    """

    def __init__(self, path: str, offset: int, length: int, placement: str) -> None:
        self.path = path
        self.offset = offset
        self.length = length
        self.placement = placement
        if not path:
            raise SidecarError("sidecar arena: the reply has no arena_path")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as error:
            raise SidecarError("sidecar arena %s: open failed: %s" % (path, error.strerror))
        try:
            size = os.fstat(fd).st_size
            if size < offset + length:
                raise SidecarError(
                    "sidecar arena %s: the file holds %d bytes; arena_offset %d + %d arena bytes "
                    "do not fit" % (path, size, offset, length))
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.view = memoryview(self._map)[offset:offset + length]

    def close(self) -> None:
        self.view.release()
        self._map.close()

    def __enter__(self) -> "SidecarArena":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SidecarClient:
    """The engine API client of one sidecar, at `endpoint`: its --engine-endpoint
    (ipc:///tmp/kvrail-<role><rank>.sock by default, or tcp://host:port). `timeout` (seconds):
    how long a request waits for its reply.

    `heartbeat` and `heartbeat_timeout` (seconds): ZeroMQ heartbeats on the connection, so
    that a sidecar that stopped answering (stopped, cut off) is noticed within the timeout, and
    one whose process died at once (liveness.py says what the engine is told then).

    `curve_key` and `curve_server_key`: a tcp engine API of a sidecar started with --curve-key
    and --curve-allowed (docs/SECURITY.md) admits only CURVE clients: this engine's own .key
    (`kvrail keygen --role engine --rank <the sidecar's rank>`) and the sidecar's .pub file
    (or its public key, Z85 text)."""

    def __init__(self, endpoint: str, timeout: float = 10.0,
                 context: Optional[zmq.Context] = None, heartbeat: float = 1.0,
                 heartbeat_timeout: float = 3.0, curve_key: Optional[str] = None,
                 curve_server_key: Optional[str] = None) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._heartbeat_timeout = heartbeat_timeout
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, int(heartbeat * 1000))
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(heartbeat_timeout * 1000))
        if (curve_key is None) != (curve_server_key is None):
            self._socket.close()
            raise SidecarError("engine API %s: CURVE needs both the engine's .key and the "
                               "sidecar's public key (curve_key and curve_server_key)" % endpoint)
        if curve_key is not None and curve_server_key is not None:
            try:
                _curve_client(self._socket, curve_key, curve_server_key)
            except SidecarError:
                self._socket.close()
                raise
        # A connection counts once its ZMTP handshake succeeded: a stopped sidecar's kernel still
        # accepts the connection itself.
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._socket.connect(endpoint)
        self._ids = itertools.count(1)
        self._events: Deque[RoomEvent] = collections.deque()
        self._ledger = RoomLedger()
        self._connected = False
        self._lost: Optional[str] = None  # why the connection is lost, while it is
        self._attach_request: Any = None  # the last accepted AttachArena, to attach again
        self._reattach = False  # the same sidecar is back with rooms to void
        self.sidecar_pid = 0  # from an accepted attach
        self.engine_token = ""  # set by an accepted attach

    def close(self) -> None:
        self._socket.disable_monitor()
        self._monitor.close()
        self._socket.close()

    @property
    def sidecar_lost(self) -> Optional[str]:
        """Why the connection to the sidecar is lost, while it is; None otherwise."""
        return self._lost

    def __enter__(self) -> "SidecarClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Requests -------------------------------------------------------------------------------

    def attach_shm(self, shm_name: str, contract: Text,
                   engine_token: str = "") -> "_pb.EngineReply":
        """Shares the engine's KV arena, a POSIX shared-memory object, and its CachePD contract
        (wire JSON, str or bytes). `engine_token` (the `engine_token` attribute after an accepted
        attach) lets a restarted engine take over while the old one is still connected."""
        request = engine_pb2.EngineRequest()
        request.attach.shm_name = shm_name
        request.attach.contract = _text(contract)
        request.attach.engine_token = engine_token
        return self._attach(request)

    def attach_allocated(self, nbytes: int, contract: Text,
                         engine_token: str = "") -> SidecarArena:
        """Asks the sidecar to allocate the KV arena itself, `nbytes` zero-filled bytes (at least
        what the contract describes), where its data plane's peers write fastest; returns it
        mapped here as a SidecarArena. The memory is the sidecar's: it frees it when it stops.
        The sidecar must run on this host in this pid namespace (the arena is reached through
        /proc/<sidecar pid>/fd/<n>)."""
        request = engine_pb2.EngineRequest()
        request.attach.allocate_bytes = nbytes
        request.attach.contract = _text(contract)
        request.attach.engine_token = engine_token
        reply = self._attach(request)
        return SidecarArena(reply.arena_path, reply.arena_offset, nbytes, reply.arena_placement)

    def attach_cuda(self, ipc_handle: bytes, nbytes: int, device: int, contract: Text,
                    engine_token: str = "", offset: int = 0) -> "_pb.EngineReply":
        """Shares GPU memory by the cudaIpcMemHandle_t bytes of the allocation that holds it: the
        arena is the `nbytes` bytes `offset` bytes into that allocation, on GPU `device` (a
        caching allocator's KV tensor may start inside a larger block; the handle names the
        block). Over a transport that cannot reach GPU memory the sidecar stages it through
        host memory: call ready() only once the forward pass's writes are done on the GPU."""
        request = engine_pb2.EngineRequest()
        request.attach.cuda_ipc_handle = bytes(ipc_handle)
        request.attach.cuda_bytes = nbytes
        request.attach.cuda_device = device
        request.attach.cuda_offset = offset
        request.attach.contract = _text(contract)
        request.attach.engine_token = engine_token
        return self._attach(request)

    def begin(self, room: int) -> "_pb.EngineReply":
        """Prefill: the engine has the request. The room exists from now on; one event with
        status BOOTSTRAPPED and the decodes' windows (DecodeWindow) comes once every decode rank
        pre-allocated it: build the source manifest for that window, run the forward pass, then
        ready()."""
        request = engine_pb2.EngineRequest()
        request.begin.room = room
        return self._begin(room, request)

    def ready(self, room: int, source_manifest: Text = "", bootstrap_token: int = -1,
              speculative_ids: Iterable[int] = (), block_tables: Optional[BlockTables] = None,
              window: Optional[Tuple[int, int]] = None, cached_tokens: int = 0,
              first_token_logprob: Optional[float] = None) -> "_pb.EngineReply":
        """Prefill: the room's cache is computed; send it to its decode ranks. The source
        blocks as CachePD manifest JSON, or as `block_tables` (one list of block ids per KV
        cache group, in the contract's group order) with `window` = (prefix_len, prompt_len),
        the decode's window from the BOOTSTRAPPED event: the sidecar builds the manifest.
        `cached_tokens`: the prompt tokens served from this prefill's own prefix cache (0 to the
        prompt length); `first_token_logprob`: the bootstrap token's log-probability, or None.
        Both reach the decode in the 2026-09 status (CACHEPD 12.9)."""
        request = engine_pb2.EngineRequest()
        request.ready.room = room
        request.ready.source_manifest = _text(source_manifest)
        _set_tables(request.ready, block_tables, window)
        request.ready.bootstrap_token = bootstrap_token
        request.ready.speculative_ids.extend(speculative_ids)
        request.ready.cached_tokens = cached_tokens
        if first_token_logprob is not None:
            request.ready.first_token_logprob = first_token_logprob
        return self._begin(room, request)

    def layers_ready(self, room: int, layers: int,
                     source_manifest: Text = "") -> "_pb.EngineReply":
        """Prefill, layer-wise streaming: the room's fields layer.<N>.* with N < layers are
        final; send them now. The room's first call gives the source manifest; its ready()
        follows the last layer (docs/ENGINE-API.md, "Layer-wise streaming")."""
        request = engine_pb2.EngineRequest()
        request.layers_ready.room = room
        request.layers_ready.layers = layers
        request.layers_ready.source_manifest = _text(source_manifest)
        return self._begin(room, request)

    def expect(self, room: int, bootstrap_address: str, destination_manifest: Text = "",
               dp_group: Optional[int] = None, block_tables: Optional[BlockTables] = None,
               window: Optional[Tuple[int, int]] = None) -> "_pb.EngineReply":
        """Decode: pages are allocated; fetch the room from the prefill node behind
        bootstrap_address ("host:port"). `dp_group`, if given, is the prefill DP group the
        engine expects the room in; CachePD routes it to room mod prefill_dp_size, and any other
        group fails the room, naming both. The destination blocks as manifest JSON, or as
        `block_tables` with `window` = (prefix_len, prompt_len), as in ready()."""
        request = engine_pb2.EngineRequest()
        request.expect.room = room
        request.expect.bootstrap_address = bootstrap_address
        request.expect.destination_manifest = _text(destination_manifest)
        _set_tables(request.expect, block_tables, window)
        if dp_group is not None:
            request.expect.dp_group = dp_group
        return self._begin(room, request)

    def poll(self, rooms: Iterable[int]) -> Dict[int, Tuple[TransferPoll, str]]:
        """The TransferPoll state of each room, as {room: (TransferPoll, reason)}."""
        return {room: (s.status, s.reason) for room, s in self.poll_states(rooms).items()}

    def poll_states(self, rooms: Iterable[int]) -> Dict[int, RoomState]:
        """Every room's state in one round trip, as {room: RoomState}: with a decode Success,
        its bootstrap token and speculative ids, so that polling needs no event."""
        request = engine_pb2.EngineRequest()
        request.poll.rooms.extend(rooms)
        reply = self._call(request)
        states: Dict[int, RoomState] = {}
        for s in reply.states:
            status = _POLL[s.status]
            if status in _ENDED:
                states[s.room] = RoomState(status, s.reason, s.bootstrap_token,
                                           tuple(s.speculative_ids), cause=s.cause,
                                           cached_tokens=s.cached_tokens,
                                           first_token_logprob=_logprob(s))
            elif status is TransferPoll.BOOTSTRAPPED and len(s.windows):
                states[s.room] = RoomState(status, "", -1, (), _windows(s.windows))
            else:  # a room in flight has nothing else to read
                states[s.room] = RoomState(status, "", -1, ())
        return states

    def abort(self, room: int, reason: str = "aborted by the engine") -> "_pb.EngineReply":
        """Gives up a room: its writes are fenced, its peers told Failed, its state freed."""
        request = engine_pb2.EngineRequest()
        request.abort.room = room
        request.abort.reason = reason
        return self._call(request)

    def stats(self) -> Dict[str, Union[int, str]]:
        """The sidecar's counters and table sizes (engine.proto SidecarStats), by field name;
        also who answers: its role ("prefill", "decode"), tp_rank, tp_size and pid.
        Open to any client, not only the engine: it does not make this client the engine."""
        stats = self._call(engine_pb2.EngineRequest(stats=engine_pb2.Stats())).stats
        return {field.name: getattr(stats, field.name) for field in stats.DESCRIPTOR.fields}

    # Events ---------------------------------------------------------------------------------

    def drain_events(self) -> List[RoomEvent]:
        """Every room outcome (RoomEvent) that has arrived, oldest first, without waiting: what
        was queued, then whatever the socket holds now, and what the client reports itself when
        the sidecar is lost (liveness.py). An empty list when there is none."""
        self._watch()
        while True:
            try:
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            message = engine_pb2.SidecarMessage()
            message.ParseFromString(frame)
            if message.HasField("event"):
                self._take(message.event)
        self._recover()
        events = list(self._events)
        self._events.clear()
        return events

    def next_event(self, timeout: Optional[float] = None) -> Optional[RoomEvent]:
        """The next room outcome (RoomEvent), or None after `timeout` seconds (0: only one that
        has arrived already; it does not wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._recover()
        while not self._events:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            message = self._receive(left)
            if message is None:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            if message.HasField("event"):
                self._take(message.event)
        return self._events.popleft()

    # Internals ------------------------------------------------------------------------------

    def _attach(self, request: "_pb.EngineRequest") -> "_pb.EngineReply":
        reply = self._call(request)
        # The sidecar's engine token: what a client presents to take over from this one.
        self.engine_token = reply.engine_token
        self.sidecar_pid = reply.sidecar_pid
        self._attach_request = engine_pb2.EngineRequest()
        self._attach_request.CopyFrom(request)
        return reply

    def _begin(self, room: int, request: "_pb.EngineRequest") -> "_pb.EngineReply":
        reply = self._call(request)
        self._ledger.begun(room)
        return reply

    def _take(self, event: "_pb.RoomEvent") -> None:
        """An event from the sidecar, through the ledger (liveness.py)."""
        shown = self._ledger.outcome(_event(event))
        if shown is not None:
            self._events.append(shown)

    def _watch(self) -> None:
        """Handles what the connection's monitor reported: a sidecar lost, or back."""
        while True:
            try:
                change = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if change["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if self._lost is not None:
                    events, to_void = self._ledger.back(sidecar_process_gone(self.sidecar_pid))
                    self._events.extend(events)
                    self._reattach = bool(to_void)
                self._connected = True
                self._lost = None
            elif change["event"] == zmq.EVENT_DISCONNECTED and self._connected:
                self._connected = False
                gone = sidecar_process_gone(self.sidecar_pid)
                self._lost = "engine API %s: the sidecar is lost (%s)" % (
                    self._endpoint, _why_lost(gone, self.sidecar_pid, self._heartbeat_timeout))
                self._events.extend(self._ledger.lost(self._lost, gone))

    def _recover(self) -> None:
        """The same sidecar is back with rooms reported Failed while it was lost: attach again
        (this connection is a new client to it), which voids them there, fenced; its outcomes
        then release their pages (liveness.py)."""
        if not self._reattach or self._lost is not None or self._attach_request is None:
            return
        request = engine_pb2.EngineRequest()
        request.CopyFrom(self._attach_request)
        request.attach.engine_token = self.engine_token
        try:
            self._attach(request)
            self._reattach = False
        except SidecarError:
            pass  # tried again at the next drain

    def _call(self, request: "_pb.EngineRequest") -> "_pb.EngineReply":
        self._watch()
        if self._lost is not None:
            raise SidecarError(self._lost)
        request.request_id = next(self._ids)
        self._socket.send(request.SerializeToString())
        deadline = time.monotonic() + self._timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SidecarError(
                    "engine API %s: no reply within %.1f s (is the sidecar running?)"
                    % (self._endpoint, self._timeout))
            message = self._receive(left)
            if message is None:
                if self._lost is not None:
                    raise SidecarError(self._lost)
                continue
            if message.HasField("event"):
                self._take(message.event)
                continue
            if message.reply.request_id != request.request_id:
                continue
            if message.reply.error:
                raise SidecarError(message.reply.error)
            return message.reply

    def _receive(self, timeout: Optional[float]) -> Optional["_pb.SidecarMessage"]:
        # zmq's poll takes whole milliseconds: round up, so a short wait is never a busy loop,
        # except 0, which must not wait at all.
        wait = None if timeout is None else int(math.ceil(timeout * 1000))
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        ready = dict(poller.poll(wait))
        if self._monitor in ready:
            self._watch()
        if self._socket not in ready:
            return None
        message = engine_pb2.SidecarMessage()
        message.ParseFromString(self._socket.recv())
        return message


def _text(value: Text) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def _set_tables(message: Any, block_tables: Optional[BlockTables],
                window: Optional[Tuple[int, int]]) -> None:
    """Block tables and their window on a Ready or an Expect."""
    if block_tables is None:
        return
    if window is None:
        raise SidecarError("block tables need their window (prefix_len, prompt_len)")
    for table in block_tables:
        message.block_tables.add().block_ids.extend(table)
    prefix_len, prompt_len = window
    message.prefix_len = prefix_len
    message.prompt_len = prompt_len


def _windows(windows: Iterable["_pb.DecodeWindow"]) -> Tuple[DecodeWindow, ...]:
    return tuple(DecodeWindow(w.session, w.decode_tp_rank, w.prefix_len, w.prompt_len)
                 for w in windows)


def _logprob(message: Any) -> Optional[float]:
    """A RoomEvent's or RoomState's first_token_logprob: None when unset (proto3 optional)."""
    if message.HasField("first_token_logprob"):
        return float(message.first_token_logprob)
    return None


def _why_lost(gone: Optional[bool], pid: int, heartbeat_timeout: float) -> str:
    """Why the connection to the sidecar went, as far as this host can tell: its process is gone
    (the connection closed with it), or it lives and answered no heartbeat (stopped, hung, or
    unreachable), or unknown (no pid: the engine never attached)."""
    if gone:
        return "its process %d is gone: the connection closed with it" % pid
    if gone is False:
        return ("it answered no heartbeat for %.1f s, and its process %d still runs: stopped, "
                "hung, or unreachable" % (heartbeat_timeout, pid))
    return ("its connection closed, or it answered no heartbeat for %.1f s"
            % heartbeat_timeout)


def _event(e: "_pb.RoomEvent") -> RoomEvent:
    return RoomEvent(e.room, _POLL[e.status], e.reason, e.bootstrap_token,
                     list(e.speculative_ids), e.bytes, e.copies, e.seconds, Pages(e.pages),
                     e.pages_released, e.pages_proven, _windows(e.windows), e.cause,
                     e.cached_tokens, _logprob(e), e.fence_seconds)


def _curve_client(socket: zmq.Socket, key_file: str, server_key: str) -> None:
    """Makes `socket` a CURVE client with the keypair of `key_file` (kvrail keygen's .key JSON)
    of the server whose public key is `server_key` (a .pub file, or its Z85 text)."""
    own = _key_json(key_file)
    if "secret" not in own:
        raise SidecarError("CURVE key %s: no \"secret\" (give the engine's .key, not a .pub)"
                           % key_file)
    if os.path.exists(server_key):
        server = _key_json(server_key)["public"]
    elif len(server_key) == 40:
        server = server_key
    else:
        raise SidecarError("CURVE server key %s: neither a .pub file nor a 40-character Z85 "
                           "public key" % server_key)
    socket.curve_secretkey = own["secret"].encode("ascii")
    socket.curve_publickey = own["public"].encode("ascii")
    socket.curve_serverkey = server.encode("ascii")


def _key_json(path: str) -> Dict[str, str]:
    """A kvrail keygen key file: JSON with "public" (and, in a .key, "secret") in Z85."""
    try:
        with open(path) as f:
            key = json.load(f)
    except (OSError, ValueError) as error:
        raise SidecarError("CURVE key %s: cannot be read as kvrail keygen JSON: %s"
                           % (path, error))

    def z85(name: str) -> bool:
        return isinstance(key.get(name), str) and len(key[name]) == 40

    if not isinstance(key, dict) or not z85("public") or ("secret" in key and not z85("secret")):
        raise SidecarError("CURVE key %s: \"public\" (and \"secret\" in a .key) must be "
                           "40-character Z85 keys, as kvrail keygen writes them" % path)
    return key
