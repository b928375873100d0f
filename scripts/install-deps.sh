#!/usr/bin/env bash
# Installs what the test suite needs on a Debian 12 machine, and nothing that is already there:
# - tshark: the independent decoder the wire tests cross-check against (Debian package);
# - python3: runs the shared ICRC oracle (present on the CI image; installed if missing);
# - cargo-fuzz: builds and runs the fuzz targets (a cargo tool, built from crates.io);
# - libibverbs-dev, librdmacm-dev, libclang-dev: rdma-core's headers, the ABI the verbs shim
#   implements; the shim builds from bindings committed in verbs-shim/bindings/, and the suite
#   regenerates them from these headers with bindgen (libclang) to check they are current;
# - ibverbs-utils, python3-pyverbs, perftest, qperf, rdmacm-utils: the unchanged programs and test suite
#   that run on it (or, for rdma_cm programs, load on it and fail cleanly);
# - iperf3: run over rsockets by scripts/test-rsocket.sh through librspreload (librdmacm1's
#   /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so; rdmacm-utils brings rstream, riostream,
#   rcopy and udpong);
# - ucx-utils, libfabric-bin: the peers `softrdma bench` compares against (UCX and libfabric
#   over tcp), run by the suite's short bench, and the middleware of scripts/test-cluster.sh
#   (UCX and libfabric over softrdma on `softrdma cluster` hosts, which also need iproute2);
# - python3-yaml: scripts/test-action.sh reads action.yml; debootstrap: scripts/test-container.sh
#   builds the image's Debian 12 base in a chroot (no container engine on CI machines);
# - openmpi-bin, libopenmpi-dev: Open MPI's mpirun and mpicc for the MPI job of test-cluster.sh;
# - qemu-system-x86, busybox-static, tcpdump, kmod, cpio, iproute2: the rdma_rxe guest of
#   conformance/interop/rxe.sh (its kernel and rdma-core come from Debian packages it downloads).
set -euo pipefail
need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
for pkg in libibverbs-dev librdmacm-dev libclang-dev python3-yaml ibverbs-utils python3-pyverbs perftest qperf rdmacm-utils librdmacm1 iperf3 ucx-utils libfabric-bin openmpi-bin libopenmpi-dev \
  qemu-system-x86 busybox-static tcpdump kmod cpio iproute2 debootstrap; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  echo "install-deps: installing ${need[*]}" >&2
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "install-deps: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked --quiet
fi
