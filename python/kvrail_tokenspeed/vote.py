"""The TP ranks' agreement on each room, once per scheduler iteration.

tokenspeed's scheduler runs the same on every attention-TP rank of a DP group, so every rank
must emit the same room events in the same iteration (its Mooncake backend all-reduces each
room's TransferPoll with MIN over the group's gloo process group). kvrail's ranks each hear of
their own room from their own sidecar, so the connector all-reduces three numbers per room
instead of one: the room's state here, whether it failed here, and whether its pages here may
still be written. A room fails on every rank once it failed on one, and its FailedEvent comes
only once no rank's pages can be written any more (docs/TOKENSPEED.md, "Failures").
"""

from typing import Any, Callable, List, NamedTuple, Sequence

# One MIN all-reduce of a list of small non-negative ints over the rank's TP group.
Reduce = Callable[[List[int]], List[int]]


class Local(NamedTuple):
    """What this rank knows of one room: its TransferPoll code here (tokenspeed's numbering,
    0 Failed .. 5 Success), whether it failed here, and whether a write may still land in its
    pages here (the room is in flight in the sidecar, or Failed with its pages held)."""

    status: int
    failed: bool
    unsafe: bool


class Agreed(NamedTuple):
    """The TP group's view of one room: the lowest status, and whether any rank failed it or
    still has pages that may be written."""

    status: int
    failed: bool
    unsafe: bool


def agree(rooms: Sequence[Local], reduce: Reduce) -> List[Agreed]:
    """Every room's Agreed, in the same order, through one MIN all-reduce."""
    if not rooms:
        return []
    flat: List[int] = []
    for room in rooms:
        flat.extend((room.status, 0 if room.failed else 1, 0 if room.unsafe else 1))
    out = reduce(flat)
    if len(out) != len(flat):
        raise ValueError("the TP vote returned %d values for %d rooms (3 a room)"
                         % (len(out), len(rooms)))
    return [Agreed(out[i], out[i + 1] == 0, out[i + 2] == 0) for i in range(0, len(out), 3)]


def alone(values: List[int]) -> List[int]:
    """The reduce of a TP group of one rank."""
    return list(values)


def gloo_min(group: Any) -> Reduce:
    """The reduce over tokenspeed's attention-TP CPU (gloo) group: torch.distributed's MIN
    all-reduce of a uint8 tensor, as tokenspeed's poll_and_all_reduce does. A group of one (or
    None) needs no round."""
    if group is None:
        return alone
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel

    if dist.get_world_size(group=group) == 1:
        return alone

    def reduce(values: List[int]) -> List[int]:
        tensor = torch.tensor(values, dtype=torch.uint8, device="cpu")
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
        return [int(v) for v in tensor.tolist()]

    return reduce
