"""Rules for pejit's own code: C++20 with -Wall -Wextra (third_party is exempt)."""

PEJIT_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
]

def pejit_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = PEJIT_COPTS + copts, **kwargs)

def pejit_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = PEJIT_COPTS + copts, **kwargs)

def pejit_cc_test(name, copts = [], deps = [], **kwargs):
    """A GoogleTest suite; links gtest_main unless the test brings its own main."""
    native.cc_test(
        name = name,
        copts = PEJIT_COPTS + copts,
        deps = deps + ["//third_party:gtest_main"],
        **kwargs
    )
