"""How a tokenspeed rank's settings become its kvrail sidecar's command line.

tokenspeed configures its Mooncake backend with a topology (KVManagerArgs.topology: attention
TP, CP and DP sizes and ranks), the prefill node's bootstrap port, and environment variables
for its timeouts and heartbeats. The same settings start the rank's sidecar, so that a
deployment sets them once (docs/TOKENSPEED.md, "Settings"). KVRAIL_* variables say what only
kvrail has.
"""

import os
import shlex
from typing import List, Mapping, NamedTuple, Optional

# tokenspeed's variables (runtime/utils/env.py at f4d8ec6) with its defaults, and the sidecar
# flag each one sets.
TIMEOUTS = (
    # (tokenspeed variable, its default, sidecar flag, lower bound tokenspeed applies)
    ("TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 120.0, "--bootstrap-timeout", 0.0),
    ("TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT", 300.0, "--waiting-timeout", 0.0),
    ("TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0, "--heartbeat-interval", 2.0),
    ("TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2.0, "--heartbeat-failures", 1.0),
)

# kvrail's own variables.
KVRAIL_BIN = "KVRAIL_BIN"  # the kvrail binary (default: `kvrail` on PATH)
KVRAIL_SIDECAR_ENDPOINT = "KVRAIL_SIDECAR_ENDPOINT"  # attach to a running sidecar (a template)
KVRAIL_SIDECAR_ARGS = "KVRAIL_SIDECAR_ARGS"  # more sidecar flags (shell words)
KVRAIL_LOG_DIR = "KVRAIL_LOG_DIR"  # where a started sidecar's stderr goes (default: /tmp)


class Topology(NamedTuple):
    """The rank's place, as tokenspeed's PDParallelTopology gives it."""

    tp_size: int
    tp_rank: int
    dp_size: int
    dp_rank: int
    cp_size: int
    global_rank: int


class SidecarPlan(NamedTuple):
    """What the launcher does for one rank: attach to `endpoint` (when `argv` is empty: the
    operator runs the sidecar), or run `argv` there."""

    endpoint: str
    argv: List[str]


def topology_of(topology: object) -> Topology:
    """A tokenspeed PDParallelTopology (or anything with its attributes) as a Topology;
    refuses, in one line, what a kvrail sidecar cannot serve."""
    values = {}
    for name in ("tp_size", "tp_rank", "dp_size", "dp_rank", "cp_size", "global_rank"):
        value = getattr(topology, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError("kvrail: the topology's %s is %r; it must be an int >= 0"
                             % (name, value))
        values[name] = value
    found = Topology(**values)
    if found.cp_size != 1:
        raise ValueError("kvrail: context parallelism (cp_size=%d) is not supported; cp_size "
                         "must be 1" % found.cp_size)
    if not (found.tp_size >= 1 and found.tp_rank < found.tp_size):
        raise ValueError("kvrail: tp_rank %d is outside tp_size %d"
                         % (found.tp_rank, found.tp_size))
    if not (found.dp_size >= 1 and found.dp_rank < found.dp_size):
        raise ValueError("kvrail: dp_rank %d is outside dp_size %d"
                         % (found.dp_rank, found.dp_size))
    return found


def timeout_flags(env: Mapping[str, str]) -> List[str]:
    """The sidecar flags of tokenspeed's timeout and heartbeat variables, each with
    tokenspeed's default when unset and the lower bound tokenspeed applies to it."""
    flags: List[str] = []
    for name, default, flag, lowest in TIMEOUTS:
        text = env.get(name)
        try:
            value = default if text is None or text == "" else float(text)
        except ValueError:
            raise ValueError("kvrail: %s=%r is not a number (seconds, or a count for "
                             "HEARTBEAT_MAX_FAILURE)" % (name, text))
        if value < 0:
            raise ValueError("kvrail: %s=%r is negative" % (name, text))
        value = max(value, lowest)
        flags += [flag, "%d" % value if flag == "--heartbeat-failures" else "%g" % value]
    return flags


def plan_sidecar(role: str, topology: Topology, bootstrap: Optional[str],
                 env: Mapping[str, str], tag: str, ib_device: Optional[str] = None) -> SidecarPlan:
    """The rank's sidecar: the operator's (KVRAIL_SIDECAR_ENDPOINT, a template with {role},
    {rank} (the global rank), {tp_rank}, {dp_rank}), else one this process starts, its engine
    API at ipc:///tmp/kvrail-tokenspeed-<tag>-<role><rank>.sock. A prefill names its node's
    bootstrap server (`bootstrap`, host:port). tokenspeed's --disaggregation-ib-device
    (`ib_device`) selects kvrail's RDMA backend on those devices (--backend verbs
    --rdma-devices), unless KVRAIL_SIDECAR_ARGS names a --backend."""
    if role not in ("prefill", "decode"):
        raise ValueError("kvrail: the disaggregation mode is %r; kvrail serves prefill and "
                         "decode" % role)
    template = env.get(KVRAIL_SIDECAR_ENDPOINT, "")
    if template:
        try:
            endpoint = template.format(role=role, rank=topology.global_rank,
                                       tp_rank=topology.tp_rank, dp_rank=topology.dp_rank)
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError("kvrail: %s=%r: %s (the template may use {role}, {rank}, "
                             "{tp_rank}, {dp_rank})" % (KVRAIL_SIDECAR_ENDPOINT, template, error))
        return SidecarPlan(endpoint, [])
    endpoint = "ipc:///tmp/kvrail-tokenspeed-%s-%s%d.sock" % (tag, role, topology.global_rank)
    argv = [kvrail_binary(env), "sidecar", "--role", role,
            "--engine-endpoint", endpoint,
            "--tp-size", str(topology.tp_size), "--tp-rank", str(topology.tp_rank)]
    if role == "prefill":
        if not bootstrap:
            raise ValueError("kvrail: a prefill rank needs its node's bootstrap address")
        argv += ["--bootstrap", bootstrap, "--dp-size", str(topology.dp_size),
                 "--dp-rank", str(topology.dp_rank)]
    argv += timeout_flags(env)
    extra = shlex.split(env.get(KVRAIL_SIDECAR_ARGS, ""))
    if ib_device and not any(word.startswith("--backend") for word in extra):
        argv += ["--backend", "verbs", "--rdma-devices", ib_device]
    argv += extra
    return SidecarPlan(endpoint, argv)


def kvrail_binary(env: Mapping[str, str]) -> str:
    return env.get(KVRAIL_BIN) or "kvrail"


def log_dir(env: Mapping[str, str]) -> str:
    """Where the kvrail processes a rank starts write their logs."""
    return env.get(KVRAIL_LOG_DIR) or env.get("TMPDIR") or "/tmp"
