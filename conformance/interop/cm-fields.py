#!/usr/bin/env python3
"""The CM messages of captures, field by field, per sender: softrdma, the kernel (rdma_rxe) and,
optionally, hardware. For INTEROP.md's rdma_cm table.

    cm-fields.py [--softrdma IP] [--bin SOFTRDMA] OURS.pcap... [-- HARDWARE.pcap...]

OURS are captures of softrdma against the kernel (rxe.sh --keep DIR: DIR/NN-cm-*.pcap); a CM MAD
from IP (default 192.168.77.1, rxe.sh's softrdma device) is softrdma's, any other the kernel's.
HARDWARE are other captures (../shared/captures/write.pcap, ...), every MAD counted as hardware's.
Each message comes from `softrdma pcap decode --json` (its `cm` object, and the BTH, DETH and UDP
fields of the packet that carried it). For each message type and field the values each sender
used are listed; fields that name one connection (comm IDs, QPNs, PSNs, TIDs, ports, addresses)
are summarised as "per connection". A line is marked `=` when softrdma and the kernel used the same
values, `~` when they differ, `!` when a MAD did not decode.
"""
import json
import subprocess
import sys
from collections import defaultdict

NAMES = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU", 0x15: "DREQ", 0x16: "DREP",
         0x17: "SIDR_REQ", 0x18: "SIDR_REP", 0x19: "LAP", 0x1A: "APR"}
# Fields whose value belongs to one connection or one run: shown as a count of distinct values.
PER_CONNECTION = {"local_comm_id", "remote_comm_id", "tid", "starting_psn", "local_qpn", "remote_qpn",
                  "service_id", "private_data", "cma_hdr.port", "cma_hdr.src", "cma_hdr.dst",
                  "primary_path.flow_label", "primary_path.local_gid", "primary_path.remote_gid",
                  "local_ca_guid", "bth.psn"}
SENDERS = ("softrdma", "kernel", "hardware")


def flatten(prefix, obj, out):
    for k, v in obj.items():
        if isinstance(v, dict):
            flatten(prefix + k + ".", v, out)
        else:
            out[prefix + k] = v


def mads(binary, path):
    """(src, message name, fields) of each CM MAD in a capture; name None when it did not decode."""
    out = subprocess.run([binary, "pcap", "decode", "--json", path], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        frame = json.loads(line)
        cm = frame.get("cm")
        if cm is None:
            continue
        if "error" in cm:
            yield frame["src"], None, {"error": cm["error"]}
            continue
        fields = {}
        flatten("", cm, fields)
        for k in ("attr", "attr_name"):
            fields.pop(k, None)
        for k in ("psn", "m", "ackreq", "se", "padcnt", "tver", "pkey"):
            fields["bth." + k] = frame[k]
        fields["deth.qkey"] = hex(frame["deth"]["qkey"])
        fields["deth.srcqp"] = frame["deth"]["srcqp"]
        fields["udp.sport"] = frame["sport"]
        yield frame["src"], NAMES.get(int(cm["attr"], 16), cm["attr"]), fields


def show(values, per_connection):
    if not values:
        return "-"
    if per_connection:
        return "per connection (%d)" % len(values)
    return "|".join(sorted(values, key=lambda v: (len(v), v)))


def main(argv):
    ours_ip, binary = "192.168.77.1", "softrdma"
    while argv and argv[0].startswith("--") and argv[0] != "--":
        opt = argv.pop(0)
        if opt == "--softrdma":
            ours_ip = argv.pop(0)
        elif opt == "--bin":
            binary = argv.pop(0)
        else:
            sys.exit(__doc__)
    ours, hardware = argv, []
    if "--" in argv:
        i = argv.index("--")
        ours, hardware = argv[:i], argv[i + 1:]
    if not ours:
        sys.exit(__doc__)
    seen = defaultdict(lambda: defaultdict(lambda: {s: set() for s in SENDERS}))
    undecodable = 0
    for path, is_hw in [(p, False) for p in ours] + [(p, True) for p in hardware]:
        for src, name, fields in mads(binary, path):
            if name is None:
                undecodable += 1
                print("! %s: a MAD from %s did not decode: %s" % (path, src, fields["error"]))
                continue
            sender = "hardware" if is_hw else ("softrdma" if src == ours_ip else "kernel")
            for k, v in fields.items():
                seen[name][k][sender].add(str(v))
    for name in [n for n in NAMES.values() if n in seen] + [n for n in seen if n not in NAMES.values()]:
        print("== %s" % name)
        for field in sorted(seen[name]):
            v = seen[name][field]
            per = field in PER_CONNECTION
            mark = "=" if v["softrdma"] == v["kernel"] or per else "~"
            if not v["softrdma"] or not v["kernel"]:
                mark = " "
            print("%s %-32s softrdma %-26s kernel %-26s hardware %s" % (
                mark, field, show(v["softrdma"], per), show(v["kernel"], per), show(v["hardware"], per)))
    return 1 if undecodable else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
