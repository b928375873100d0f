#!/usr/bin/env bash
# The whole test suite: installs what it needs, then builds once and runs every test.
#   unit, property and conformance tests (golden packets, real captures, tshark, ICRC oracle),
#   command-line tests, lint, the verbs shim (its ABI test, unchanged rdma-core programs and
#   perftest, the pyverbs suite), rsockets with unchanged programs (scripts/test-rsocket.sh),
#   interop with Linux's rdma_rxe (conformance/interop/rxe.sh),
#   middleware (UCX, libfabric) and perftest between `softrdma cluster` hosts (scripts/test-cluster.sh),
#   a short `softrdma bench` (that the comparison runs end to end; its figures are not checked)
#   and a short run of each fuzz target.
# Environment: FUZZ_SECONDS (default 30) per fuzz target; 0 builds the targets without running.
#   SOAK_SECONDS (default 60): the soak's length.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
[ -d ../shared/reference/wire ] || { echo "test.sh: ../shared (reference data) is missing beside the repository" >&2; exit 1; }

bash scripts/install-deps.sh

step() { printf '\n== %s (at %dm%02ds)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

step "format"
cargo fmt --all -- --check

step "build (all targets, once)"
cargo build --workspace --all-targets --locked

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "verbs shim (release: the real-program tests below and the demo share this build)"
bash scripts/build-shim.sh

step "tests"
# The committed C bindings are checked against the headers install-deps.sh put here (a missing
# header or libclang fails the check instead of skipping it).
SOFTRDMA_REQUIRE_HEADERS=1 cargo test --workspace --locked

step "the embedded devices' tests again with the application's calls driving the devices (SOFTRDMA_PROGRESS=application)"
SOFTRDMA_PROGRESS=application cargo test --locked -p softrdma-device --test embedded

step "example programs (examples/c: the seeds' workloads)"
bash scripts/build-examples.sh

step "unchanged rdma-core programs on the shim (the provider data path, the default: each program runs its own QPs)"
bash scripts/test-verbs-programs.sh

step "the unchanged programs again (quick sizes) on the device path (SOFTRDMA_DATAPATH=device: the daemons run every QP)"
SOFTRDMA_DATAPATH=device bash scripts/test-verbs-programs.sh --quick

step "the provider data path (SOFTRDMA_DATAPATH=provider): the programs run their own QPs on the daemons' steered ports"
bash scripts/test-provider.sh --quick

step "the program matrix, CI's sample (every program on both data paths with the capture off and on, a few under faults; --full runs it all)"
bash scripts/test-matrix.sh

step "the unchanged programs again (quick sizes) on the device path with every client's memory reached through its memory helper (SOFTRDMA_MEMORY_HELPER=1: the fallback where the kernel refuses process_vm_readv to the daemon)"
SOFTRDMA_DATAPATH=device SOFTRDMA_MEMORY_HELPER=1 bash scripts/test-verbs-programs.sh --quick

step "an installed softrdma (cargo install --path cli; exec from outside the repository, shim unpacked from the binary)"
bash scripts/test-install.sh

step "the README's first command on a fresh machine (rdma-core headers and libclang hidden in a mount namespace; cold build; needs root)"
bash scripts/test-fresh-build.sh

step "the GitHub Actions action (action.yml's steps run as the runner would, no network)"
bash scripts/test-action.sh

step "the container image (Containerfile; without a container engine: its runtime stage in a chroot, as root)"
bash scripts/test-container.sh

step "rdma-core's pyverbs test suite on the shim (the provider data path: XRC on the programs' XRC sides, multicast passed on by the daemon)"
bash scripts/pyverbs.sh

step "rdma-core's pyverbs test suite again on the device path (SOFTRDMA_DATAPATH=device)"
SOFTRDMA_DATAPATH=device bash scripts/pyverbs.sh

step "softrdma conform against softrdma (every case under both profiles and on both data paths; a case that does not hold fails the run)"
bash scripts/test-conform.sh

step "rsockets with unchanged programs (rstream, riostream, rcopy, udpong; iperf3 and a Python echo server under librspreload; with the capture on, on both data paths, under 1% loss)"
bash scripts/test-rsocket.sh

step "interop with Linux's own Soft-RoCE (rdma_rxe in a qemu guest; needs root for its network namespace)"
if [ "$(id -u)" = 0 ]; then
  bash conformance/interop/rxe.sh
else
  echo "SKIPPED: conformance/interop/rxe.sh needs root (a network namespace and a tap device); CI runs it as root"
fi

step "isolation between users (root's device, an unprivileged uid; needs root)"
bash scripts/test-isolation.sh

step "middleware on a simulated cluster (softrdma cluster: network-namespace hosts; needs root)"
if [ "$(id -u)" = 0 ]; then
  bash scripts/test-cluster.sh
else
  echo "SKIPPED: scripts/test-cluster.sh needs root (network namespaces, veth, a bridge); CI runs it as root"
fi

step "softrdma bench --quick (runs end to end; the table is printed, not written, not judged)"
target/release/softrdma bench --quick --no-write --no-install --qps 2000 --addr0 127.0.0.31 --addr1 127.0.0.32

step "softrdma soak (60 s: two devices with faults and the capture on, client processes killed and replaced; exit 1 on any violation or any frame the capture lost)"
soak_pcap=$(mktemp -d)
target/release/softrdma soak --seconds "${SOAK_SECONDS:-60}" --pcap "$soak_pcap"
rm -rf "$soak_pcap"

step "fuzz targets"
fuzz_seconds=${FUZZ_SECONDS:-30}
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
# Seeds from ../shared and every kept regression input (fuzz/regressions/), run first by libFuzzer.
bash scripts/fuzz-corpus.sh "$corpus"
cd fuzz
# cargo fuzz needs nightly-only rustc flags; RUSTC_BOOTSTRAP lets the one stable toolchain take them.
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
if [ "$fuzz_seconds" -gt 0 ]; then
  # Two targets at a time (a core each); a target that fails fails the step.
  running=()
  for t in parse_packet read_capture handle_packet ipc_message parse_cm_mad; do
    (cargo fuzz run -O "$t" "$corpus/$t" -- -max_total_time="$fuzz_seconds" -timeout=30 -print_final_stats=0 2>&1 \
      | tail -n 1 | sed "s/^/$t: /") &
    running+=($!)
    if [ ${#running[@]} -ge 2 ]; then
      wait "${running[0]}"
      running=("${running[@]:1}")
    fi
  done
  for p in "${running[@]}"; do wait "$p"; done
fi
cd "$repo"
step "all tests passed"
