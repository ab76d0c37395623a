#!/usr/bin/env bash
# `make bench-slow-disk`: the benchmark kit (bench/run.sh) with the data of etcd and rlog on
# a slowed volume, so that the ratios are known on a slow disk too, not only on whatever disk
# the host has (docs/performance.md, "A slow disk on purpose"). The volume is slowfs
# (bench/slowfs: a FUSE passthrough whose file syncs wait SLOW_DISK_LATENCY more, at most
# SLOW_DISK_QUEUE at a time), built from the Go module proxy on first use and mounted over a
# directory of BENCH_DIR for the run.
#   SLOW_DISK_LATENCY      added to every file sync (default 2ms: a disk whose fdatasync is
#                          about 2 ms, where etcd's serial put takes 2.2-2.5 ms)
#   SLOW_DISK_QUEUE        syncs the disk takes at once (default 1: one after the other, as
#                          a local disk; 0: any number, as a network block device)
# Every variable of bench/run.sh applies (BENCH_QUICK=1 for a short run).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

latency=${SLOW_DISK_LATENCY:-2ms}
queue=${SLOW_DISK_QUEUE:-1}
work=${BENCH_DIR:-$HOME/.cache/rlog-bench}
backing=$work/slow-disk-backing
mnt=$work/slow-disk

log "== build slowfs"
bin=$(tests/powerfs/build.sh bench/slowfs)

log "== mount $mnt (syncs +$latency, $queue at a time) over $backing"
if mountpoint -q "$mnt"; then
  umount "$mnt" 2>/dev/null || umount -l "$mnt" || die "$mnt is mounted and will not unmount"
fi
rm -rf "$backing"
mkdir -p "$backing" "$mnt"
"$bin" -sync-latency "$latency" -queue "$queue" "$backing" "$mnt" 2>"$work/slowfs.log" &
slowfs=$!
cleanup() {
  kill -TERM "$slowfs" 2>/dev/null || true
  wait "$slowfs" 2>/dev/null || true
  mountpoint -q "$mnt" && umount -l "$mnt"
  rm -rf "$backing"
}
trap cleanup EXIT
for _ in $(seq 100); do
  mountpoint -q "$mnt" && break
  kill -0 "$slowfs" 2>/dev/null || die "slowfs exited: $(cat "$work/slowfs.log")"
  sleep 0.1
done
mountpoint -q "$mnt" || die "slowfs did not mount $mnt in 10 s: $(cat "$work/slowfs.log")"

log "== the kit on the slowed volume"
BENCH_DIR=$mnt BENCH_VOLUME="slowfs: every file sync +$latency, $queue at a time (0: any number; bench/slow_disk.sh)" \
  bench/run.sh
