"""kvrail as tokenspeed's transfer backend: `--disaggregation-transfer-backend kvrail`.

tokenspeed's prefill and decode executors (executors.py, over prefill.py, decode.py and
connector.py) drive one kvrail sidecar per rank (launcher.py starts and supervises it, from
tokenspeed's settings: settings.py) with the kvrail_engine client; the KV arena is shared by
shared-memory name or CUDA IPC handle (arena.py). tokenspeed selects it through
tokenspeed.patch or, unpatched, hook.install() (python3 -m kvrail_tokenspeed ...).
docs/TOKENSPEED.md says how a deployment turns it on.
"""


def install() -> None:
    """Makes `--disaggregation-transfer-backend kvrail` work without patching tokenspeed
    (hook.py)."""
    from kvrail_tokenspeed.hook import install as install_hook  # noqa: PLC0415

    install_hook()


__all__ = ["install"]
