"""How a tokenspeed rank's KV arena is shared with its sidecar.

tokenspeed's arena is one contiguous uint8 tensor per rank (CacheArena.buffer), and its
transfer contract's base is that tensor's data pointer (KVArgs.kv_data_ptr). The connector
finds what holds that pointer:

- CPU: a POSIX shared-memory object mapped at that address from its first byte
  (/proc/self/maps names it /dev/shm/<name>): `attach_shm(name, contract)`. An arena in private
  memory cannot be shared with another process and is refused in one line.
- GPU: the CUDA allocation that contains it (the driver's cuMemGetAddressRange), its IPC
  handle (cuIpcGetMemHandle) and the arena's offset into it: `attach_cuda(handle, nbytes,
  device, contract, offset)`. An allocation of PyTorch's expandable segments has no IPC
  handle and is refused in one line.
"""

import ctypes
import json
import os
from typing import Any, NamedTuple, Optional, Union

from kvrail_engine import SidecarClient


class ArenaError(ValueError):
    """The arena cannot be shared with a sidecar: the message names the rule it broke."""


class ShmArena(NamedTuple):
    name: str  # the shm_open name: "/" and its name under /dev/shm


class CudaArena(NamedTuple):
    handle: bytes  # cudaIpcMemHandle_t of the allocation that holds the arena
    offset: int  # the arena's first byte, from that allocation's base
    device: int


Located = Union[ShmArena, CudaArena]


def arena_bytes(contract: bytes) -> int:
    """The arena's size as its contract says it: (num_lcm_blocks + 1) x lcm_block_bytes (the
    plan's null parent block included)."""
    try:
        plan = json.loads(contract)["plan"]
        return (int(plan["num_lcm_blocks"]) + 1) * int(plan["lcm_block_bytes"])
    except (ValueError, KeyError, TypeError) as error:
        raise ArenaError("kvrail: the cache contract has no plan with num_lcm_blocks and "
                         "lcm_block_bytes: %s" % error)


def shm_mapping(address: int, maps: str = "/proc/self/maps") -> Optional[ShmArena]:
    """The /dev/shm object mapped at `address`, from its first byte; None when no /dev/shm
    mapping holds `address`. ArenaError when one does but not from its first byte."""
    with open(maps) as f:
        for line in f:
            words = line.split(None, 5)
            if len(words) < 6:
                continue
            begin, end = (int(x, 16) for x in words[0].split("-"))
            if not begin <= address < end:
                continue
            path = words[5].strip()
            if not path.startswith("/dev/shm/"):
                return None
            first = int(words[2], 16) + address - begin
            if first != 0:
                raise ArenaError("kvrail: the KV arena at 0x%x starts %d bytes into %s; a "
                                 "shared-memory arena must start at its object's first byte"
                                 % (address, first, path))
            return ShmArena(path[len("/dev/shm"):])
    return None


# CUDA driver API constants (cuda.h).
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_MEMORYTYPE_DEVICE = 2


def _libcuda() -> Optional[Any]:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def expandable_segments(env: "os._Environ[str]" = os.environ) -> bool:
    """Whether PyTorch's caching allocator makes expandable segments here (its
    PYTORCH_CUDA_ALLOC_CONF, or PYTORCH_ALLOC_CONF)."""
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + env.get("PYTORCH_ALLOC_CONF", "")
    return "expandable_segments:true" in conf.replace(" ", "").lower()


def cuda_allocation(address: int) -> Optional[CudaArena]:
    """The CUDA allocation holding device address `address` (the calling thread's current
    context), as an IPC handle and an offset; None when there is no driver or the address is
    not device memory."""
    cuda = _libcuda()
    if cuda is None:
        return None
    kind = ctypes.c_uint(0)
    if cuda.cuPointerGetAttribute(ctypes.byref(kind), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  ctypes.c_uint64(address)) != 0:
        return None
    if kind.value != _CU_MEMORYTYPE_DEVICE:
        return None
    if expandable_segments():
        raise ArenaError("kvrail: the KV arena is in PyTorch expandable segments "
                         "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which have no "
                         "CUDA IPC handle; run without expandable segments")
    device = ctypes.c_int(0)
    cuda.cuPointerGetAttribute(ctypes.byref(device), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               ctypes.c_uint64(address))
    base = ctypes.c_uint64(0)
    size = ctypes.c_size_t(0)
    if cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                    ctypes.c_uint64(address)) != 0:
        raise ArenaError("kvrail: the CUDA driver knows no allocation at 0x%x" % address)
    handle = (ctypes.c_char * 64)()
    status = cuda.cuIpcGetMemHandle(ctypes.byref(handle), base)
    if status != 0:
        raise ArenaError("kvrail: the CUDA allocation holding the KV arena has no IPC handle "
                         "(cuIpcGetMemHandle: error %d); it must come from cudaMalloc, not "
                         "virtual memory management (expandable segments)" % status)
    return CudaArena(bytes(handle), address - base.value, device.value)


def locate(address: int) -> Located:
    """Where the arena at `address` lives, or ArenaError naming why it cannot be shared."""
    shm = shm_mapping(address)
    if shm is not None:
        return shm
    cuda = cuda_allocation(address)
    if cuda is not None:
        return cuda
    raise ArenaError("kvrail: the KV arena at 0x%x is neither in POSIX shared memory "
                     "(/dev/shm) nor CUDA device memory; a sidecar cannot reach it. A CPU "
                     "arena must be a shared mapping of a /dev/shm object" % address)


def attach(client: SidecarClient, address: int, contract: bytes) -> Located:
    """Shares the arena at `address` (tokenspeed's kv_data_ptr) and its contract with the
    client's sidecar; returns where it lives."""
    found = locate(address)
    if isinstance(found, ShmArena):
        client.attach_shm(found.name, contract)
    else:
        client.attach_cuda(found.handle, arena_bytes(contract), found.device, contract,
                           offset=found.offset)
    return found
