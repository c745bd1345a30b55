"""Compiler options shared by BUILD files."""

# For code whose loops touch every byte a test moves: the byte patterns that fill and check
# arenas (engine/memory:pattern, cluster:kv_pattern) and the route property test's oracle. The
# sanitizer passes compile at -O0 (ASan) or -O1 (TSan) for a short compile; this, placed after
# them on the command line, optimises these few files, still instrumented. At -O0 these loops
# were most of the CPU of the tests that move hundreds of MiB (docs/ci-time.md).
HOT_LOOP_COPTS = ["-O2"]
