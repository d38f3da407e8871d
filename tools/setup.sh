#!/usr/bin/env bash
# Installs the Debian 12 packages pejit needs, and nothing when all are there.
#
#   tools/setup.sh            the build, the tests and the Tree-LSTM demo
#   tools/setup.sh mlp        also the Fashion-MNIST data set (examples/mlp)
#   tools/setup.sh bench      also libblas.so.3 set to OpenBLAS, for PyTorch, the peer in bench/
#   tools/setup.sh check      also clang and libFuzzer, for tools/check.sh and tools/fuzz.sh
#
# Idempotent and non-interactive; run as root on a fresh machine (apt-get
# update runs only when something is missing).
set -euo pipefail

packages=(
  bazel-bootstrap      # Bazel 4.2.3
  bazel-rules-java     # rules_java for Bazel 4, so nothing is downloaded
  g++ python3
  llvm-19-dev          # LLVM 19 ORC LLJIT (shared libLLVM-19)
  libtbb-dev           # oneTBB
  libspdlog-dev libfmt-dev
  libgtest-dev
  libopenblas-dev
  libtcmalloc-minimal4 # the allocator every pejit binary links (third_party:malloc)
  nlohmann-json3-dev
  libcli11-dev
  libbenchmark-dev
  zlib1g-dev           # gzip: the Fashion-MNIST files of examples/mlp
  libssl-dev           # HMAC-SHA256 of the code cache's entries (support/mac.h)
  python3-dev pybind11-dev  # the `pejit` Python module (python/), for /usr/bin/python3
  python3-numpy python3-pytest
  python3-torch        # pejit.torch (python/pejit/torch.py) and its tests
  libopenmpi-dev openmpi-bin  # data-parallel training (dist/), mpirun in the tests
)
for group in "$@"; do
  case "$group" in
    mlp) packages+=(dataset-fashion-mnist) ;;
    bench) ;;
    check) packages+=(clang libclang-rt-14-dev) ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown group '$group' (known: mlp, bench, check)" >&2; exit 2 ;;
  esac
done

# PyTorch (bench) calls the BLAS behind Debian's libblas.so.3 alternative,
# which may be the reference BLAS (15-40x slower than OpenBLAS): point it at
# OpenBLAS. Prints what it changed; needs root only when it changes anything.
openblas_alternatives() {
  local arch name target
  arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
  for name in libblas.so.3 liblapack.so.3; do
    target=/usr/lib/$arch/openblas-pthread/$name
    [[ -e $target ]] || { echo "setup.sh: $target missing (libopenblas0-pthread)" >&2; return 1; }
    if [[ "$(readlink -f "/usr/lib/$arch/$name")" != "$(readlink -f "$target")" ]]; then
      if [[ $(id -u) -ne 0 ]]; then
        echo "setup.sh: $name does not point at OpenBLAS; as root: update-alternatives --set $name-$arch $target" >&2
        return 1
      fi
      update-alternatives --set "$name-$arch" "$target" >&2
    fi
  done
}

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  [[ " $* " == *" bench "* ]] && openblas_alternatives
  exit 0
fi

echo "setup.sh: installing ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
  echo "setup.sh: needs root to install packages; run: sudo $0 $*" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
apt-get "${apt_opts[@]}" update -qq
apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
[[ " $* " == *" bench "* ]] && openblas_alternatives
echo "setup.sh: done" >&2
