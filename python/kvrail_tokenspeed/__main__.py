"""`python3 -m kvrail_tokenspeed ARGS`: tokenspeed's command line (`tokenspeed ARGS`) with
kvrail's hook installed, in this process and in each process tokenspeed spawns (a spawned
process imports its parent's main module first: this one), so that
`--disaggregation-transfer-backend kvrail` works on an unpatched tokenspeed."""

from kvrail_tokenspeed.hook import install

install()

if __name__ == "__main__":
    from tokenspeed.cli import main

    main()
