"""The values the engine API hands an engine: TransferPoll codes, page states, and one room's
outcome (RoomEvent) or state (RoomState)."""

import enum
from typing import List, NamedTuple, Optional, Tuple


class TransferPoll(enum.IntEnum):
    """CACHEPD section 7.1 TransferPoll codes."""

    FAILED = 0
    BOOTSTRAPPING = 1
    BOOTSTRAPPED = 2
    WAITING_FOR_INPUT = 3
    TRANSFERRING = 4
    SUCCESS = 5
    # Not a room state: the status of the one notice (pages_released) that gives back the pages
    # of a decode room whose Failed said Pages.HELD. Each room has exactly one SUCCESS or FAILED.
    PAGES_RELEASED = 6


class Pages(enum.IntEnum):
    """A terminal event's word on the room's pages (engine.proto PageState)."""

    UNSPECIFIED = 0
    REUSABLE = 1  # no write of the room can land any more: reuse them now
    HELD = 2  # a write may still land: wait for the event with pages_released


class DecodeWindow(NamedTuple):
    """A decode rank's pre-allocation of a prefill room: the window [prefix_len, prompt_len)
    the room's source manifest must cover (prefix caching may start it past 0)."""

    session: str
    decode_tp_rank: int
    prefix_len: int
    prompt_len: int


class RoomEvent(NamedTuple):
    """One room's outcome. A decode Failed with pages HELD is followed by an event of the same
    room with status PAGES_RELEASED and pages_released once they may be reused (a notice, not a
    second Failed: each room has exactly one SUCCESS or FAILED event); pages_proven says
    whether every writer was fenced or they were released on a timeout. A prefill room the
    engine began with begin() also gets one event with status BOOTSTRAPPED and `windows`.
    A Failed one names its `cause`, one word from a fixed list (docs/ENGINE-API.md): aborted,
    timeout, peer_failed, expired, handshake, transport, bounds, invalid, refused, digest,
    engine, bootstrap, other; and sidecar_lost for what this client reports itself when its
    sidecar is lost (the sidecar could not). A release notice's `fence_seconds` is how long
    the sidecar waited for the fence (docs/ENGINE-API.md, "When pages are safe"). A decode Success carries, besides the bootstrap token and
    speculative ids, `cached_tokens` (the prompt tokens the prefill served from its own prefix
    cache: the largest count any prefill rank reported, 0 from a snapshot-era prefill) and
    `first_token_logprob` (the bootstrap token's log-probability, None when no rank sent one;
    CACHEPD 12.9)."""

    room: int
    status: TransferPoll
    reason: str
    bootstrap_token: int
    speculative_ids: List[int]
    bytes: int
    copies: int
    seconds: float
    pages: Pages = Pages.UNSPECIFIED
    pages_released: bool = False
    pages_proven: bool = False
    windows: Tuple[DecodeWindow, ...] = ()
    cause: str = ""
    cached_tokens: int = 0
    first_token_logprob: Optional[float] = None
    fence_seconds: float = 0.0


# The cause of the Failed events this client makes itself: its sidecar was lost (killed,
# stopped, unreachable), so the sidecar could say nothing of the room.
SIDECAR_LOST = "sidecar_lost"


class RoomState(NamedTuple):
    """One room's state as poll_states() reports it: bootstrap_token (-1: none),
    speculative_ids, cached_tokens and first_token_logprob are a decode Success's, as in its
    RoomEvent; windows a begun prefill room's, once Bootstrapped."""

    status: TransferPoll
    reason: str
    bootstrap_token: int
    speculative_ids: Tuple[int, ...]
    windows: Tuple[DecodeWindow, ...] = ()
    cause: str = ""  # Failed: as its RoomEvent's
    cached_tokens: int = 0
    first_token_logprob: Optional[float] = None


def failed(room: int, reason: str, pages: Pages, released: bool = False,
           proven: bool = False) -> RoomEvent:
    """A Failed outcome the client itself reports (the sidecar could not): cause sidecar_lost. With
    `released`, the release notice of a room told Failed with Pages.HELD before (status
    PAGES_RELEASED)."""
    status = TransferPoll.PAGES_RELEASED if released else TransferPoll.FAILED
    return RoomEvent(room, status, reason, -1, [], 0, 0, 0.0, pages, released,
                     proven, cause=SIDECAR_LOST)
