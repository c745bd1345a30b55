"""kvrail_fuzz_test: one fuzz harness, run by the mutation driver and by libFuzzer."""

def kvrail_fuzz_test(name, srcs, corpus, deps = [], data = [], runs = 20000, seconds = 60):
    """Defines `name` (a test) and `name`_libfuzzer over a harness of LLVMFuzzerTestOneInput.

    The test links fuzz_driver.cc and runs `runs` mutated inputs (at most `seconds`) from
    `corpus`. `name`_libfuzzer links the same objects into a libFuzzer target whose arguments
    are libFuzzer's own (tools/fuzz runs it): it builds only under --config=asan (clang; the
    configuration compiles the fuzzed code with libFuzzer's coverage instrumentation,
    .bazelrc), so it is tagged manual and `bazel build //...` with gcc leaves it out. `data` is
    what the harness reads besides its corpus (the CachePD vectors its fixed contracts come
    from).
    """
    native.cc_library(
        name = name + "_harness",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    native.cc_test(
        name = name,
        size = "medium",
        data = corpus + data,
        args = [
            "--runs=%d" % runs,
            "--seconds=%d" % seconds,
            native.package_name() + "/corpus/" + name[:-len("_fuzz")],
        ],
        deps = [
            ":" + name + "_harness",
            "//tests/fuzz:fuzz_driver",
        ],
        tags = ["fuzz"],
    )
    native.cc_binary(
        name = name + "_libfuzzer",
        testonly = True,
        data = data,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = [":" + name + "_harness"],
    )
