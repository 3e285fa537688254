#!/usr/bin/env bash
# The client package on a fresh Debian 12: builds the .deb (the `package` preset), installs it
# with apt into a minimal Debian 12 root made by debootstrap (cached in build/debian12/root),
# checks the binary runs there, that the postinst made the `starling` user and its state
# directory, and verifies the systemd unit with `systemd-analyze verify`.
# Usage (as root): bash scripts/package_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
export DEBIAN_FRONTEND=noninteractive
command -v debootstrap >/dev/null || apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
cmake --preset package >/dev/null
cmake --build --preset package
deb=$(ls build/package/starling_*_amd64.deb | head -1)
echo "== $deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,/Description:/p'
dpkg-deb --contents "$deb" | awk '{print $6}'

root=build/debian12/root
if [[ ! -x $root/usr/bin/apt-get ]]; then
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
fi
cp "$deb" "$root/tmp/starling.deb"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mounted=0
if mount --bind /proc "$root/proc" 2>/dev/null; then mounted=1; fi
trap '((mounted)) && umount "$root/proc" || true' EXIT
chroot "$root" apt-get update -qq
chroot "$root" apt-get install -y -qq /tmp/starling.deb >/dev/null
echo "== installed in a fresh Debian 12 root:"
chroot "$root" dpkg -s starling | grep -E "^(Status|Version|Depends):"
chroot "$root" /usr/bin/starling --help | head -3
chroot "$root" /usr/bin/starling info | head -5
chroot "$root" getent passwd starling
stat -c "%U:%G %a %n" "$root/var/lib/starling"
echo "== systemd-analyze verify (systemd installed in the root, as on a real machine)"
chroot "$root" apt-get install -y -qq --no-install-recommends systemd >/dev/null
chroot "$root" systemd-analyze verify /usr/lib/systemd/system/starling-client.service
echo "package check passed"
