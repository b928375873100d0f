#!/usr/bin/env bash
# Builds the rdma_rxe test guest from Debian packages: the distribution's kernel (linux-image-amd64's
# current ABI, with rdma_rxe and the kernel's rdma_cm) and rdma-core's user space (ibverbs-utils,
# rdmacm-utils, perftest and the rxe provider), unpacked with dpkg -x, plus busybox, bash and
# iproute2's `rdma` and `tc` from this host. Nothing prebuilt is kept in
# the repository; the downloads are cached in DIR/debs.
# Usage: build-guest.sh DIR      Output: DIR/vmlinux (uncompressed, PVH entry: boots without
# in-guest decompression), DIR/initrd.cpio, DIR/kernel-version.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
W="${1:?usage: build-guest.sh DIR}"
mkdir -p "$W/debs"
W="$(cd "$W" && pwd)"
cd "$W"

# The kernel package linux-image-amd64 points at (it has rdma_rxe, ib_uverbs and virtio-net as modules).
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$kpkg" ]; then
  apt-get update -qq
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$kpkg" ] || { echo "build-guest: apt knows no linux-image-amd64" >&2; exit 1; }
kv=${kpkg#linux-image-}
# rdmacm-utils (rping, ucmatose, ...) needs librdmacm1, libibverbs1 and libc (apt-cache depends).
user_pkgs="ibverbs-utils libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 perftest librdmacm1 libibumad3 rdmacm-utils"
# What is unpacked: the kernel and the package list (a changed list unpacks again).
stamp="$kv $user_pkgs"
if [ -f kernel-version ] && [ "$(cat kernel-version)" = "$kv" ] && [ -f vmlinux ] && [ -d ustage ] &&
  [ -f unpacked ] && [ "$(cat unpacked)" = "$stamp" ]; then
  echo "build-guest: kernel $kv and user space already unpacked in $W"
else
  rm -rf kroot ustage vmlinux unpacked
  (cd debs && apt-get download -q "$kpkg" $user_pkgs 2>&1 | grep -vE 'Download is performed unsandboxed|^Get:' || true)
  ls debs/"${kpkg}"_*.deb >/dev/null || { echo "build-guest: downloading $kpkg failed" >&2; exit 1; }
  dpkg -x debs/"${kpkg}"_*.deb kroot
  mkdir -p ustage
  for d in debs/*.deb; do
    case "$d" in *linux-image*) ;; *) dpkg -x "$d" ustage ;; esac
  done
  # The bzImage carries an xz-compressed vmlinux; qemu boots the ELF directly through its PVH note.
  python3 - "kroot/boot/vmlinuz-$kv" vmlinux <<'PY'
import lzma, sys
d = open(sys.argv[1], "rb").read()
start = d.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit("build-guest: no xz stream in " + sys.argv[1])
open(sys.argv[2], "wb").write(lzma.LZMADecompressor().decompress(d[start:]))
PY
  echo "$kv" > kernel-version
  echo "$stamp" > unpacked
fi

# The initramfs: busybox, the modules rdma_rxe needs (dependencies from modinfo), the programs and
# the libraries ldd names for them.
km="kroot/lib/modules/$kv"
R=initrd
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,etc/libibverbs.d,proc,sys,dev,tmp,root,lib64,usr/bin,usr/lib/x86_64-linux-gnu/libibverbs}
cp /usr/bin/busybox "$R/bin/busybox"
for a in $(/usr/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$R/bin/$a"; done
declare -A seen
order=()
add_mod() {
  local m=$1 p deps d
  [ -n "${seen[$m]:-}" ] && return
  seen[$m]=1
  p=$(find "$km" -name "$m.ko" -o -name "$m.ko.xz" | head -1)
  [ -n "$p" ] || return 0 # built into the kernel
  deps=$(modinfo -F depends "$p" | tr ',' ' ')
  for d in $deps; do add_mod "$d"; done
  mkdir -p "$R/lib/modules/$kv/$(dirname "${p#"$km"/}")"
  cp "$p" "$R/lib/modules/$kv/${p#"$km"/}"
  order+=("${p#"$km"/}")
}
# rdma_ucm is the kernel's rdma_cm for user space (/dev/infiniband/rdma_cm); it brings rdma_cm, ib_cm,
# iw_cm and configfs.
# sch_ingress (ingress and clsact), cls_u32, act_mirred, ifb and sch_netem: guest/cm-delay.sh, with
# which rxe.sh delays the CM MADs the guest receives (or sends) for perftest -R (see there).
for m in virtio_pci virtio_net crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe rdma_ucm \
  sch_ingress cls_u32 act_mirred ifb sch_netem; do add_mod "$m"; done
printf '%s\n' "${order[@]}" > "$R/etc/modorder"
lib="$W/ustage/usr/lib/x86_64-linux-gnu"
copy_bin() { # SOURCE DEST (relative to the initramfs root)
  cp -L "$1" "$R/$2"
  LD_LIBRARY_PATH="$lib" ldd "$1" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | while read -r l; do
    [ -f "$l" ] || continue
    local t="$R/$l"
    case "$l" in "$lib"/*) t="$R/usr/lib/x86_64-linux-gnu/$(basename "$l")" ;; esac
    mkdir -p "$(dirname "$t")"
    cp -L "$l" "$t"
  done
}
for b in ibv_devinfo ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong \
  ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat \
  rping ucmatose udaddy mckey rstream riostream rcopy udpong; do
  copy_bin "ustage/usr/bin/$b" "usr/bin/$b"
done
# The file rxe.sh's rcopy checks copy (rsockets, issue 56): 8 MiB made from a fixed seed, so the
# host makes the same bytes (rxe.sh, rsocket_data) and checks each copy by its SHA-256.
mkdir -p "$R/usr/share/softrdma"
python3 -c 'import random,sys; r=random.Random(56); sys.stdout.buffer.write(r.randbytes(8 << 20))' > "$R/usr/share/softrdma/rcopy.bin"
# rping ends its threads with pthread_exit/pthread_cancel, for which glibc loads libgcc_s at run
# time (ldd does not list it).
gcc_s=$(ldconfig -p | awk '/libgcc_s.so.1 .*x86-64/ {print $NF; exit}')
mkdir -p "$R/lib/x86_64-linux-gnu"
cp -L "$gcc_s" "$R/lib/x86_64-linux-gnu/libgcc_s.so.1"
# The example programs (examples/c), when rxe.sh passes their build directory: the same binaries
# as on the softrdma side, linked here against the guest's own libraries.
for b in "${RXE_GUEST_EXAMPLES:-/nonexistent}"/*; do
  [ -x "$b" ] && [ -f "$b" ] && copy_bin "$b" "usr/bin/$(basename "$b")"
done
copy_bin "$(command -v rdma)" usr/bin/rdma
copy_bin "$(command -v tc)" usr/bin/tc
copy_bin "$(command -v bash)" usr/bin/bash # for /dev/udp: the bad-input sender
for p in "$lib"/libibverbs/librxe-*.so; do copy_bin "$p" "usr/lib/x86_64-linux-gnu/libibverbs/$(basename "$p")"; done
cp ustage/etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
echo 'root:x:0:0:root:/root:/bin/sh' > "$R/etc/passwd"
echo 'root:x:0:' > "$R/etc/group"
install -m 755 "$here/guest/init.sh" "$R/init"
install -m 755 "$here/guest/agent.sh" "$R/usr/bin/agent"
install -m 755 "$here/guest/retry-connect.sh" "$R/usr/bin/retry-connect"
install -m 755 "$here/guest/cm-listening.sh" "$R/usr/bin/cm-listening"
install -m 755 "$here/guest/cm-delay.sh" "$R/usr/bin/cm-delay"
(cd "$R" && find . | cpio -o -H newc --quiet) > initrd.cpio
echo "build-guest: kernel $kv, initramfs $(du -h initrd.cpio | cut -f1) in $W"
