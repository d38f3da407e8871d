#!/bin/sh
echo "bazel coverage is not supported in pejit's offline build" >&2
exit 1
