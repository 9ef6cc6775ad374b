#!/usr/bin/env bash
# Build the CPU flavour's base image, Debian bookworm (Python 3.11), without pulling from any
# image registry: debootstrap a minimal root filesystem from the Debian mirror apt already
# uses on this host, then `docker import` it.
#
#   docker/base/build-base-image.sh [IMAGE]        (default qkstudy-base:bookworm; needs root)
#
# A no-op when IMAGE already exists (delete it to rebuild). The GPU flavour does not use this:
# it builds FROM a CUDA base image (docker/README.md).
set -euo pipefail

image="${1:-qkstudy-base:bookworm}"
suite=bookworm

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image exists"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "error: debootstrap needs root (run: sudo $0 $image)" >&2
  exit 2
fi
command -v debootstrap >/dev/null || { echo "error: apt-get install debootstrap" >&2; exit 2; }

# The mirror this host's apt is configured with (deb822 or one-line format), else Debian's CDN.
mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' \
           /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
         | grep -v security | head -n1 | awk '{print $2}' || true)
mirror="${mirror:-http://deb.debian.org/debian}"
security="${mirror%/debian*}/debian-security"

root=$(mktemp -d /tmp/qkstudy-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap $suite from $mirror"
debootstrap --variant=minbase "$suite" "$root/rootfs" "$mirror" >"$root/debootstrap.log" 2>&1 \
  || { tail -n 30 "$root/debootstrap.log" >&2; exit 1; }

# Updates and security fixes for every image built on top; no package cache in the image.
cat >"$root/rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
EOF
rm -rf "$root"/rootfs/var/lib/apt/lists/* "$root"/rootfs/var/cache/apt/archives/*.deb
# Images built on top never start services while installing packages.
printf '#!/bin/sh\nexit 101\n' >"$root/rootfs/usr/sbin/policy-rc.d"
chmod 755 "$root/rootfs/usr/sbin/policy-rc.d"

tar -C "$root/rootfs" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' \
  --message "debootstrap --variant=minbase $suite $mirror" - "$image" >/dev/null
echo "built $image"
