"""Fuzz targets: one harness, two builds.

`pejit_fuzz_target(name)` makes
  - `name`: the harness as a libFuzzer binary under --config=fuzz (clang,
    see tools/fuzz.sh), or with a main that runs the inputs it is given;
  - `name_corpus_test`: the suite's regression test, every file of
    corpus/<name>/ (seeds, and inputs that once crashed) run through the
    harness, with the build's sanitizers.
"""

load("//:pejit.bzl", "PEJIT_COPTS")

def pejit_fuzz_target(name, deps = []):
    native.cc_binary(
        name = name,
        srcs = [name + ".cc"],
        copts = PEJIT_COPTS,
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + ["//fuzz:harness", "//third_party:malloc"] + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = [name + ".cc"],
        copts = PEJIT_COPTS,
        args = ["fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/**"]),
        deps = deps + ["//fuzz:harness", "//fuzz:replay_main", "//third_party:malloc"],
    )
