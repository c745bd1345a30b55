"""`python3 -m kvrail_tokenspeed.engine ARGS`: tokenspeed's engine process with kvrail's hook
(hook.py) installed, in it and in every rank process it spawns.

It runs the engine module KVRAIL_ENGINE_MODULE names (default: tokenspeed's headless engine,
tokenspeed.runtime.entrypoints.engine) as __main__, with ARGS. tokenspeed starts its ranks with
multiprocessing's spawn, and a spawned process imports its parent's main module before it runs
its target: this module, which stays the main module (the engine module runs in a namespace
of its own) and installs the hook there too; it runs no engine of its own then. The ranks'
targets must be importable functions, as tokenspeed's run_event_loop is.
"""

import os
import runpy

from kvrail_tokenspeed.hook import install

DEFAULT_ENGINE_MODULE = "tokenspeed.runtime.entrypoints.engine"
ENGINE_MODULE = "KVRAIL_ENGINE_MODULE"

install()

if __name__ == "__main__":
    runpy.run_module(os.environ.get(ENGINE_MODULE) or DEFAULT_ENGINE_MODULE,
                     run_name="__main__", alter_sys=False)
