"""`--disaggregation-transfer-backend kvrail` without patching tokenspeed: install() makes the
same five choices as tokenspeed.patch, by replacing them as tokenspeed's modules are imported.

    import kvrail_tokenspeed; kvrail_tokenspeed.install()

in every process of the server before tokenspeed parses its arguments or builds its event loop.
tokenspeed starts its engine and rank processes itself; `python3 -m kvrail_tokenspeed ...`
(__main__.py) and `python3 -m kvrail_tokenspeed.engine ...` (engine.py) install it in each.
install() imports nothing of tokenspeed: each replacement is made right after its module first
runs (or at once, if it ran already). What it replaces:

- TransferBackend gets the member KVRAIL ("kvrail");
- get_kv_class and create_kv_transfer answer kvrail's (backend.py) for it, in their modules
  and in every module that imported them by name;
- the event loop's start-up check ("non-Mooncake transfer backend") is passed by showing it
  "mooncake" while EventLoop.__init__ runs, during which create_kv_transfer builds kvrail's
  executors; the server argument reads "kvrail" again afterwards;
- the server argument's choices include "kvrail".
"""

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from typing import Any, Callable, Optional, Sequence

from kvrail_tokenspeed import backend as choice

UTILS = "tokenspeed.runtime.pd.utils"
FACTORY = "tokenspeed.runtime.pd.factory"
EVENT_LOOP = "tokenspeed.runtime.engine.event_loop"
SERVER_ARGS = "tokenspeed.runtime.utils.server_args"

_installed = False
_inside_event_loop = threading.local()  # EventLoop.__init__ shows the check "mooncake"


def install() -> None:
    """Installs the hook (once; later calls do nothing)."""
    global _installed  # pylint: disable=global-statement
    if _installed:
        return
    _installed = True
    after_import(UTILS, _patch_utils)
    after_import(FACTORY, _patch_factory)
    after_import(SERVER_ARGS, _patch_server_args)
    after_import(EVENT_LOOP, _patch_event_loop)


def installed() -> bool:
    return _installed


def _patch_utils(utils: types.ModuleType) -> None:
    _add_member(utils.TransferBackend)
    _replace(utils, "get_kv_class", _get_kv_class(utils.get_kv_class))


def _patch_factory(factory: types.ModuleType) -> None:
    _replace(factory, "create_kv_transfer", _create_kv_transfer(factory.create_kv_transfer))


def _add_member(enum_class: Any) -> None:
    """TransferBackend.KVRAIL = "kvrail" (an Enum admits no new member by assignment: it is
    made as the enum machinery makes its own)."""
    if "KVRAIL" in enum_class.__members__:
        return
    member = object.__new__(enum_class)
    member._name_ = "KVRAIL"
    member._value_ = choice.NAME
    type.__setattr__(enum_class, "KVRAIL", member)
    enum_class._member_map_["KVRAIL"] = member
    enum_class._member_names_.append("KVRAIL")
    enum_class._value2member_map_[choice.NAME] = member


def _get_kv_class(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_kv_class(transfer_backend: Any, class_type: Any) -> Any:
        if choice.is_kvrail(transfer_backend):
            return choice.kv_class(class_type)
        return original(transfer_backend, class_type)

    get_kv_class.__wrapped__ = original  # type: ignore[attr-defined]
    return get_kv_class


def _create_kv_transfer(original: Callable[..., Any]) -> Callable[..., Any]:
    # The event loop calls it by keyword: the parameters keep tokenspeed's names.
    def create_kv_transfer(mode: str, backend: Any, args: Any, kv_args: Any,
                           gloo_group: Any) -> Any:
        if choice.is_kvrail(backend) or getattr(_inside_event_loop, "kvrail", False):
            return choice.create_kv_transfer(mode, args, kv_args, gloo_group)
        return original(mode, backend, args, kv_args, gloo_group)

    create_kv_transfer.__wrapped__ = original  # type: ignore[attr-defined]
    return create_kv_transfer


def _replace(module: types.ModuleType, name: str, replacement: Callable[..., Any]) -> None:
    """module.name = replacement, and in every loaded module that imported it by name."""
    original = getattr(module, name)
    for loaded in list(sys.modules.values()):
        if loaded is not None and getattr(loaded, name, None) is original:
            setattr(loaded, name, replacement)
    setattr(module, name, replacement)


def _patch_server_args(module: types.ModuleType) -> None:
    server_args = module.ServerArgs
    original = server_args.add_cli_args

    def add_cli_args(parser: Any) -> None:
        original(parser)
        for action in parser._actions:  # pylint: disable=protected-access
            if "--disaggregation-transfer-backend" in action.option_strings:
                if action.choices is not None and choice.NAME not in action.choices:
                    action.choices = list(action.choices) + [choice.NAME]

    server_args.add_cli_args = staticmethod(add_cli_args)


def _patch_event_loop(module: types.ModuleType) -> None:
    event_loop = module.EventLoop
    original = event_loop.__init__
    factory = sys.modules[FACTORY]
    setattr(module, "create_kv_transfer", factory.create_kv_transfer)

    def __init__(self: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
        if not choice.is_kvrail(server_args.disaggregation_transfer_backend):
            original(self, server_args, *args, **kwargs)
            return
        server_args.disaggregation_transfer_backend = "mooncake"
        _inside_event_loop.kvrail = True
        try:
            original(self, server_args, *args, **kwargs)
        finally:
            _inside_event_loop.kvrail = False
            server_args.disaggregation_transfer_backend = choice.NAME

    event_loop.__init__ = __init__


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after the module `name` is first executed."""

    def __init__(self, name: str, patch: Callable[[types.ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[types.ModuleType] = None) -> Optional[Any]:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module
        patch = self.patch

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            patch(module)

        setattr(loader, "exec_module", exec_module)
        return spec


def after_import(name: str, patch: Callable[[types.ModuleType], None]) -> None:
    """patch(module) now if `name` is loaded, else right after it is."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, patch))
