"""An engine module for e2e_test's hook case, shaped as tokenspeed's engine entry point is: run
as __main__, it starts a rank process with multiprocessing's spawn whose target is an importable
function. The rank checks that tokenspeed, imported there, chooses kvrail: the hook reached it
(kvrail_tokenspeed.engine is the main module a spawned process imports first)."""

import multiprocessing
import sys


def probe() -> None:
    import tokenspeed_env

    tokenspeed_env.load()
    from kvrail_tokenspeed.launcher import KvrailBootstrapServer
    from tokenspeed.runtime.pd import utils

    chosen = (utils.TransferBackend("kvrail") is utils.TransferBackend.KVRAIL
              and utils.get_kv_class(utils.TransferBackend.KVRAIL,
                                     utils.KVClassType.BOOTSTRAP_SERVER) is KvrailBootstrapServer)
    print("rank: main module %s, kvrail chosen: %s" % (sys.modules["__main__"].__spec__.name,
                                                       chosen), flush=True)
    sys.exit(0 if chosen else 3)


if __name__ == "__main__":
    from spawn_probe import probe as rank  # by its module's name: what spawn can pickle

    multiprocessing.set_start_method("spawn", force=True)
    process = multiprocessing.Process(target=rank)
    process.start()
    process.join()
    sys.exit(process.exitcode)
