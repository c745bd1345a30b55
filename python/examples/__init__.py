"""Engine ranks to copy from, installed with the package: `python3 -m
kvrail_engine.examples.engine_example --help` (a decode rank's few calls) and
`python3 -m kvrail_engine.examples.reference_engine --help` (a whole rank of either role)."""
