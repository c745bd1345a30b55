"""kvrail's answers at tokenspeed's backend choice points, which tokenspeed.patch (a patch of
tokenspeed) and hook.py (the same choices at import time) both call.

tokenspeed f4d8ec6 chooses its transfer backend by hand in five places: the TransferBackend
enum and get_kv_class (runtime/pd/utils.py), create_kv_transfer (runtime/pd/factory.py), the
event loop's check of the backend (runtime/engine/event_loop.py) and the server argument's
choices (runtime/utils/server_args.py).
"""

from typing import Any, Optional

NAME = "kvrail"  # --disaggregation-transfer-backend kvrail


def is_kvrail(backend: Any) -> bool:
    """Whether a TransferBackend (or its string value) is kvrail."""
    return getattr(backend, "value", backend) == NAME


def kv_class(class_type: Any) -> Optional[Any]:
    """get_kv_class for kvrail: a bootstrap server class (kvrail bootstrap, which the prefill
    front end starts); kvrail has no managers, senders or receivers (None, as get_kv_class
    answers for a class a backend lacks): its executors are the interface."""
    if getattr(class_type, "name", class_type) == "BOOTSTRAP_SERVER":
        from kvrail_tokenspeed.launcher import KvrailBootstrapServer  # noqa: PLC0415
        return KvrailBootstrapServer
    return None


def create_kv_transfer(mode: str, args: Any, kv_args: Any, gloo_group: Any) -> Any:
    """create_kv_transfer for kvrail: the role's executor, backed by the rank's sidecar."""
    from kvrail_tokenspeed.executors import create_executor  # noqa: PLC0415 (imports tokenspeed)
    return create_executor(mode, args, kv_args, gloo_group)
