#!/usr/bin/env bash
# `make test` once the local cluster is up: the unit suite beside the e2e suites.
#
# Why beside: the e2e suites wait on Kubernetes most of the time (60 % of 2 cores idle while
# they run alone), the unit suite keeps both cores busy; measured warm on 2 cores, one after
# the other they took 8 + 24 minutes. The unit suite runs in a session of its own: the kernel
# schedules each session as one group when autogroups are on (sched(7)), so its 4 workers
# weigh as much as one cluster component, not as 4 processes. Tried: beside, in the e2e
# suites' session, both were done in 27 min, the e2e suites starved to 26 min 45 s; beside at
# nice 10, the e2e suites took 23 min but the unit suite starved so that the
# Spark example hit its 5-minute timeout and a 0.2 s probe went unanswered. Rejected: the
# unit suite beside the cluster's first build too (both CPU-bound: on a cold machine
# kube-apiserver's build took over 9 minutes instead of 3, and warm there is nothing to build).
#
# Usage: tests/run_all.sh UNIT_CMD... -- E2E_CMD...   (each E2E_CMD one argument, a shell
# command; run in order, stopping at the first that fails: the next ones need it)
# Exit status: 0 when every command passed; else 1, once the unit suite has ended too (a
# unit failure does not stop the e2e suites, so one run reports both); 2 for bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

unit_cmd=()
while [[ $# -gt 0 && $1 != -- ]]; do unit_cmd+=("$1"); shift; done
[[ ${#unit_cmd[@]} -gt 0 && ${1:-} == -- ]] || die "usage: $0 UNIT_CMD... -- E2E_CMD..."
shift
[[ $# -gt 0 ]] || die "no e2e command after --"

unit_log=$(mktemp -t rlog-unit.XXXXXX)
unit_end=$unit_log.end # the time the unit suite ended, written by its session
unit_pid=
start=$(date +%s)
minutes() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }

show_unit_log() { # once: the unit suite's output, which ran to a file
  [[ -s $unit_log ]] || return 0
  echo "================ unit suite output (ran beside the e2e suites) ================"
  cat "$unit_log"
  : > "$unit_log"
}
cleanup() {
  # CI's time limit or a ^C: the unit suite (its own process group) goes too, and what it
  # printed so far is shown
  if [[ -n $unit_pid ]] && kill -0 "$unit_pid" 2>/dev/null; then
    kill -- "-$unit_pid" 2>/dev/null || true
  fi
  show_unit_log
  rm -f "$unit_log" "$unit_end"
}
trap cleanup EXIT

log "== unit suite started beside the e2e suites, in a session of its own: ${unit_cmd[*]}"
UNIT_END=$unit_end setsid bash -c '"$@"; rc=$?; date +%s > "$UNIT_END"; exit $rc' \
  unit "${unit_cmd[@]}" > "$unit_log" 2>&1 < /dev/null &
unit_pid=$!

e2e_rc=0
for cmd in "$@"; do
  log "== $cmd"
  if ! bash -c "$cmd"; then
    e2e_rc=1
    log "FAILED: $cmd (the rest of the e2e commands are skipped: they need it)"
    break
  fi
done
e2e_done=$(($(date +%s) - start))

unit_rc=0
if kill -0 "$unit_pid" 2>/dev/null; then log "== waiting for the unit suite"; fi
wait "$unit_pid" || unit_rc=$?
unit_pid=
unit_done=$(($(cat "$unit_end" 2>/dev/null || date +%s) - start))
show_unit_log

log "unit suite: $([[ $unit_rc -eq 0 ]] && echo passed || echo "FAILED (rc $unit_rc)"), done after $(minutes "$unit_done")"
log "e2e suites: $([[ $e2e_rc -eq 0 ]] && echo passed || echo FAILED), done after $(minutes "$e2e_done")"
[[ $unit_rc -eq 0 && $e2e_rc -eq 0 ]] || exit 1
