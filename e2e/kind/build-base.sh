#!/usr/bin/env bash
# The kind node's operating system: Debian bookworm from debootstrap with systemd, containerd,
# runc, iptables and the CNI plugins from Debian's packages, cached as a rootfs tarball
# ($KIND_BASE_TAR). Nothing of Kubernetes is in it; build-node.sh adds that.
source "$(dirname "$0")/lib.sh"

PKGS=(systemd systemd-sysv dbus containerd runc iptables containernetworking-plugins conntrack
  iproute2 iputils-ping mount util-linux procps ca-certificates kmod socat ethtool libseccomp2
  nftables)

if [[ -f $KIND_BASE_TAR ]]; then log "kind base (debootstrap bookworm rev $KIND_BASE_REV): cached"; exit 0; fi
command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
t=$SECONDS; d=$(dirname "$KIND_BASE_TAR")/rootfs
log "kind base: debootstrap bookworm (${PKGS[*]})"
rm -rf "$d"; mkdir -p "$d"
debootstrap --variant=minbase --include="$(IFS=,; echo "${PKGS[*]}")" \
  bookworm "$d" http://deb.debian.org/debian > "$KIND_LOGS/debootstrap.log" 2>&1 ||
  die "debootstrap failed: see $KIND_LOGS/debootstrap.log"
# Units a container has no use for (consoles, udev, time sync with the host's clock, ...).
for u in getty.target console-getty.service systemd-udevd.service systemd-udev-trigger.service \
  systemd-timesyncd.service systemd-modules-load.service systemd-networkd.service \
  systemd-resolved.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
  fstrim.timer dpkg-db-backup.timer; do
  ln -sf /dev/null "$d/etc/systemd/system/$u"
done
rm -rf "$d"/var/cache/apt/archives/*.deb "$d"/var/lib/apt/lists/* "$d"/var/log/*.log
# An empty machine-id: systemd makes a new one at each boot, so nodes differ.
: > "$d/etc/machine-id"; rm -f "$d/var/lib/dbus/machine-id"
tar -C "$d" --numeric-owner -cf "$KIND_BASE_TAR.tmp" . && mv "$KIND_BASE_TAR.tmp" "$KIND_BASE_TAR"
rm -rf "$d"
log "kind base: built in $((SECONDS - t))s ($(du -h "$KIND_BASE_TAR" | cut -f1))"
