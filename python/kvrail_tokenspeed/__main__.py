"""`python3 -m kvrail_tokenspeed ARGS`: tokenspeed's command line (`tokenspeed ARGS`) with kvrail's
hook (hook.py) installed, so that `--disaggregation-transfer-backend kvrail` works on an
unpatched tokenspeed. `serve` starts the engine as a process of its own (the module
TS_SERVE_ENGINE_MODULE names): it is started through kvrail_tokenspeed.engine instead, which
installs the hook there and in the ranks it spawns, then runs that module."""

import os

from kvrail_tokenspeed.engine import ENGINE_MODULE
from kvrail_tokenspeed.hook import install

ENGINE_OF_SERVE = "TS_SERVE_ENGINE_MODULE"  # tokenspeed's (cli/_proc.py)


def main() -> None:
    install()
    if os.environ.get(ENGINE_OF_SERVE) != "kvrail_tokenspeed.engine":
        from tokenspeed.cli import _proc  # noqa: PLC0415

        os.environ[ENGINE_MODULE] = (os.environ.get(ENGINE_OF_SERVE)
                                     or getattr(_proc, "_ENGINE_MODULE_DEFAULT"))
        os.environ[ENGINE_OF_SERVE] = "kvrail_tokenspeed.engine"
    from tokenspeed.cli import main as tokenspeed_main  # noqa: PLC0415

    tokenspeed_main()


if __name__ == "__main__":
    main()
