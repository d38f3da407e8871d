"""Rules for pejit's own code: C++20 with -Wall -Wextra (third_party is exempt)."""

PEJIT_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
]

def pejit_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = PEJIT_COPTS + copts, **kwargs)

# Every program links the allocator of //third_party:malloc.
def pejit_cc_binary(name, copts = [], deps = [], **kwargs):
    native.cc_binary(name = name, copts = PEJIT_COPTS + copts, deps = deps + ["//third_party:malloc"], **kwargs)

def pejit_cc_test(name, copts = [], deps = [], **kwargs):
    """A GoogleTest suite; links gtest_main unless the test brings its own main."""
    native.cc_test(
        name = name,
        copts = PEJIT_COPTS + copts,
        deps = deps + ["//third_party:gtest_main", "//third_party:malloc"],
        **kwargs
    )

def pejit_embed_text(name, src, symbol):
    """A .cc defining `const char pejit::<symbol>[]` with the contents of `src`.

    Lets a program carry a .pj model without finding files at run time.
    """
    native.genrule(
        name = name,
        srcs = [src],
        outs = [name + ".cc"],
        cmd = ("(echo 'namespace pejit { extern const char {s}[]; const char {s}[] = R\"PEJIT_EMBED('; " +
               "cat $<; echo ')PEJIT_EMBED\"; }') > $@").replace("{s}", symbol),
    )
