#!/bin/sh
# The image's packages and user (Containerfile; scripts/test-container.sh runs the same in a
# chroot where no container engine is available): rdma-core's tools, perftest, rdmacm-utils, and
# an unprivileged user `softrdma` the image runs as.
set -eu
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  ibverbs-utils perftest rdmacm-utils iproute2 ca-certificates >/dev/null
rm -rf /var/lib/apt/lists/*
id softrdma >/dev/null 2>&1 || useradd --create-home --shell /bin/sh softrdma
