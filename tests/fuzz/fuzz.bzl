"""kvrail_fuzz_test: one fuzz harness, run by the mutation driver or by libFuzzer."""

def kvrail_fuzz_test(name, srcs, corpus, deps = [], data = [], runs = 20000, seconds = 60):
    """Defines `name` (a test) over a harness that defines LLVMFuzzerTestOneInput.

    Without --define=fuzzer=libfuzzer the test links fuzz_driver.cc and runs `runs` mutated
    inputs (at most `seconds`) from `corpus`; with it, the binary is a libFuzzer target whose
    arguments are libFuzzer's own. `data` is what the harness reads besides its corpus (the
    CachePD vectors its fixed contracts come from).
    """
    native.cc_test(
        name = name,
        size = "medium",
        srcs = srcs,
        data = corpus + data,
        args = select({
            "//tests/fuzz:libfuzzer": [],
            "//conditions:default": [
                "--runs=%d" % runs,
                "--seconds=%d" % seconds,
                native.package_name() + "/corpus/" + name[:-len("_fuzz")],
            ],
        }),
        deps = deps + select({
            "//tests/fuzz:libfuzzer": [],
            "//conditions:default": ["//tests/fuzz:fuzz_driver"],
        }),
        linkopts = select({
            "//tests/fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = ["fuzz"],
    )
