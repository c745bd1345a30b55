"""kvrail's executors for tokenspeed: subclasses of tokenspeed's DisaggPrefillExecutor and
DisaggDecodeExecutor (its event loop checks them with isinstance) whose calls go to a kvrail
sidecar per rank instead of Mooncake. Imports tokenspeed: its pd/factory.py calls
create_executor() for `--disaggregation-transfer-backend kvrail` (tokenspeed.patch, or hook.py).

The base classes' __init__ is not called: it builds Mooncake managers. What the subclasses keep
of the bases is what is not transfer: the decode's reset_valid_cache_length.
"""

import logging
import os
import socket
from typing import Any, Optional

from kvrail_engine import SidecarClient
from tokenspeed.runtime.pd.cache_protocol import build_cache_block_manifest
from tokenspeed.runtime.pd.decode_executor import DisaggDecodeExecutor
from tokenspeed.runtime.pd.prefill_executor import DisaggPrefillExecutor
from tokenspeed_scheduler import PD

from kvrail_tokenspeed import arena, settings
from kvrail_tokenspeed.connector import Connector, ManifestBuilder
from kvrail_tokenspeed.decode import DecodeConnector
from kvrail_tokenspeed.launcher import Supervised
from kvrail_tokenspeed.prefill import PrefillConnector
from kvrail_tokenspeed.vote import gloo_min

logger = logging.getLogger("kvrail_tokenspeed")


def manifest_builder(layout: Any) -> ManifestBuilder:
    """tokenspeed's own manifest of a request row (build_cache_block_manifest), as wire JSON."""

    def build(op: Any, row: int, prefix_len: int, prompt_len: int) -> bytes:
        manifest = build_cache_block_manifest(op, layout=layout, request_row=row,
                                              prefix_len=prefix_len, prompt_len=prompt_len)
        return bytes(manifest.to_wire_bytes())

    return build


def bootstrap_address(args: Any) -> str:
    """The prefill node's bootstrap server, as tokenspeed's Mooncake prefill computes it: the
    host of --dist-init-addr (else this host's address), at --disaggregation-bootstrap-port."""
    if args.dist_init_addr:
        host = socket.gethostbyname(args.dist_init_addr.split(":")[0])
    else:
        from tokenspeed.runtime.utils.network import get_ip  # noqa: PLC0415
        host = get_ip()
    return "%s:%d" % (host, args.bootstrap_port)


class Rank:
    """What a rank's executor is built from: its sidecar (started, or the operator's), the
    client attached to it with the arena, and the TP vote."""

    def __init__(self, role: str, args: Any, kv_args: Any, gloo_group: Any) -> None:
        topology = settings.topology_of(args.topology)
        self.topology = topology
        self.contract = bytes(kv_args.cache_layout.to_wire_bytes())
        plan = settings.plan_sidecar(role, topology,
                                     bootstrap_address(args) if role == "prefill" else None,
                                     os.environ, tag=str(os.getpid()),
                                     ib_device=getattr(kv_args, "ib_device", None))
        self.sidecar: Optional[Supervised] = None
        if plan.argv:
            log = os.path.join(settings.log_dir(os.environ), "kvrail-sidecar-%s-%s%d.log"
                               % (os.getpid(), role, topology.global_rank))
            self.sidecar = Supervised(plan.argv, "sidecar ready", log)
            self.sidecar.start()
        self.client = SidecarClient(plan.endpoint, timeout=30.0)
        self.address = int(kv_args.kv_data_ptr)
        try:
            self.attach()
        except Exception:  # the refusal is the error's one line: nothing left behind it
            self.client.close()
            if self.sidecar is not None:
                self.sidecar.stop()
            raise
        self.reduce = gloo_min(gloo_group)
        self.manifest = manifest_builder(kv_args.cache_layout)
        schedule = getattr(kv_args, "cache_producer_schedule", None)
        self.producer_steps = schedule.fields_by_step if schedule is not None else None
        logger.info("kvrail: %s rank %d (tp %d/%d, dp %d/%d) on sidecar %s", role,
                    topology.global_rank, topology.tp_rank, topology.tp_size, topology.dp_rank,
                    topology.dp_size, plan.endpoint)

    def attach(self) -> None:
        arena.attach(self.client, self.address, self.contract)

    def connector_args(self) -> Any:
        return dict(client=self.client, events=PD, manifest=self.manifest,
                    reduce=self.reduce, sidecar=self.sidecar, attach=self.attach)


class KvrailPrefillExecutor(PrefillConnector, DisaggPrefillExecutor):
    def __init__(self, args: Any, kv_args: Any, gloo_group: Any) -> None:
        rank = Rank("prefill", args, kv_args, gloo_group)
        self.cache_layout = kv_args.cache_layout
        PrefillConnector.__init__(self, dp_size=rank.topology.dp_size,
                                  dp_rank=rank.topology.dp_rank,
                                  producer_steps=rank.producer_steps, **rank.connector_args())


class KvrailDecodeExecutor(DecodeConnector, DisaggDecodeExecutor):
    def __init__(self, args: Any, kv_args: Any, gloo_group: Any) -> None:
        rank = Rank("decode", args, kv_args, gloo_group)
        self.cache_layout = kv_args.cache_layout
        DecodeConnector.__init__(self, **rank.connector_args())


def create_executor(mode: str, args: Any, kv_args: Any, gloo_group: Any) -> Connector:
    """tokenspeed's create_kv_transfer for the kvrail backend."""
    if mode == "prefill":
        return KvrailPrefillExecutor(args, kv_args, gloo_group)
    if mode == "decode":
        return KvrailDecodeExecutor(args, kv_args, gloo_group)
    raise NotImplementedError("kvrail: disaggregation mode %r is not served; kvrail serves "
                              "prefill and decode" % mode)
