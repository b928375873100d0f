#!/usr/bin/env bash
# Seeds a corpus directory for each fuzz target from the reference data in ../shared:
#   parse_packet  the golden packets; read_capture  a few real captures and the coverage capture;
#   parse_cm_mad  the CM MADs of the hardware captures; handle_packet, ipc_message  empty (they
#   grow from nothing); then every kept regression input (fuzz/regressions/<target>/).
# Usage: scripts/fuzz-corpus.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=${1:?usage: scripts/fuzz-corpus.sh DIR}
targets="parse_packet read_capture handle_packet ipc_message parse_cm_mad"
for t in $targets; do mkdir -p "$corpus/$t"; done
for f in ../shared/reference/wire/golden/*.hex; do
  python3 -c 'import sys; open(sys.argv[2], "wb").write(bytes.fromhex(open(sys.argv[1]).read().strip()))' \
    "$f" "$corpus/parse_packet/$(basename "$f" .hex)"
done
cp ../shared/captures/send.pcap ../shared/captures/write.pcap ../shared/captures/read2.pcap \
  ../shared/captures/nvme-discover2.pcap ../shared/reference/wire/golden/coverage.pcap "$corpus/read_capture/"
# The CM MADs of the hardware captures (tshark hex dumps: a blank line between frames; the MAD is
# the 256 bytes after Ethernet, IPv4, UDP, BTH and DETH, i.e. from byte 62).
for f in ../shared/reference/cm/*.cm.hex; do
  python3 - "$f" "$corpus/parse_cm_mad/$(basename "$f" .cm.hex)" <<'PY'
import sys
frames, cur = [], []
for line in open(sys.argv[1]):
    if not line.strip():
        if cur: frames.append(cur); cur = []
        continue
    cur += [int(t, 16) for t in line[6:54].split()]
if cur: frames.append(cur)
for i, fr in enumerate(frames):
    open(f"{sys.argv[2]}-{i}", "wb").write(bytes(fr[62:62 + 256]))
PY
done
for t in $targets; do
  if [ -d "fuzz/regressions/$t" ]; then cp fuzz/regressions/$t/* "$corpus/$t/" 2>/dev/null || true; fi
done
