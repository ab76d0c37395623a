#!/usr/bin/env bash
# Start/stop a 3-member etcd cluster on 127.0.0.1 for the etcd baseline benchmark.
#
#   bench/etcd_cluster.sh start  [DIR]   install etcd if missing, start 3 members, wait for health
#   bench/etcd_cluster.sh status [DIR]   show per-member status (etcdctl endpoint status)
#   bench/etcd_cluster.sh stop   [DIR]   kill the members by pid and remove their data
#   bench/etcd_cluster.sh check          exit 1 printing the members' ports something listens
#                                        on (an etcd left running), 0 if all are free
#
# DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/rlog-bench/etcd (real disk, not tmpfs).
# Members: m1..m3, client ports 23791-23793, peer ports 23801-23803.
# Uses etcd 3.4 from Debian (package etcd-server, plus etcd-client for etcdctl).
set -euo pipefail

cmd="${1:-start}"
dir="${2:-${XDG_CACHE_HOME:-$HOME/.cache}/rlog-bench/etcd}"
names=(m1 m2 m3)
client_ports=(23791 23792 23793)
peer_ports=(23801 23802 23803)
endpoints="127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793"

log() { echo "etcd_cluster: $*" >&2; }

ensure_installed() {
    if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
        return
    fi
    log "installing etcd-server and etcd-client from Debian"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q etcd-server etcd-client
}

port_in_use() {
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

# The members' ports something listens on, on stdout; fails if there is any.
check_ports() {
    local taken=()
    for p in "${client_ports[@]}" "${peer_ports[@]}"; do
        if port_in_use "$p"; then taken+=("$p"); fi
    done
    if ((${#taken[@]})); then
        echo "${taken[*]}"
        return 1
    fi
}

member_alive() {
    local pidfile="$dir/$1.pid"
    [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

start() {
    ensure_installed
    # Debian's package enables a system etcd on 2379/2380 where an init system runs it.
    # We never use it; just say so if it is there.
    if port_in_use 2379; then
        log "note: something (probably the distro's own etcd) listens on 2379; not using it"
    fi
    for i in 0 1 2; do
        if member_alive "${names[$i]}"; then
            log "${names[$i]} already running (pid $(cat "$dir/${names[$i]}.pid")); run stop first"
            exit 1
        fi
    done
    local taken
    if ! taken="$(check_ports)"; then
        log "ports $taken are already in use; refusing to start"
        exit 1
    fi
    mkdir -p "$dir"
    local initial_cluster=""
    for i in 0 1 2; do
        initial_cluster+="${initial_cluster:+,}${names[$i]}=http://127.0.0.1:${peer_ports[$i]}"
    done
    local token="rlog-bench-$$-$(date +%s)"
    for i in 0 1 2; do
        local n="${names[$i]}" c="http://127.0.0.1:${client_ports[$i]}"
        local p="http://127.0.0.1:${peer_ports[$i]}"
        rm -rf "${dir:?}/$n.data"
        # env -i: etcd also reads ETCD_* variables; keep the environment from leaking in.
        setsid env -i PATH="$PATH" HOME="$HOME" etcd \
            --name "$n" \
            --data-dir "$dir/$n.data" \
            --listen-client-urls "$c" --advertise-client-urls "$c" \
            --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
            --initial-cluster "$initial_cluster" \
            --initial-cluster-token "$token" \
            --initial-cluster-state new \
            --logger zap --log-outputs stderr --log-level warn \
            </dev/null >"$dir/$n.log" 2>&1 &
        echo $! >"$dir/$n.pid"
    done
    log "started pids $(cat "$dir"/m?.pid | tr '\n' ' ')in $dir; waiting for health"
    local deadline=$((SECONDS + 30))
    until etcdctl --endpoints="$endpoints" --command-timeout=2s endpoint health >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "cluster not healthy after 30 s; logs in $dir/*.log"
            etcdctl --endpoints="$endpoints" endpoint health >&2 || true
            exit 1
        fi
        for n in "${names[@]}"; do
            if ! member_alive "$n"; then
                log "$n exited; tail of $dir/$n.log:"
                tail -20 "$dir/$n.log" >&2
                exit 1
            fi
        done
        sleep 0.3
    done
    log "healthy: $(etcd --version | head -1)"
    etcdctl --endpoints="$endpoints" endpoint status -w table >&2
    echo "$endpoints"
}

stop() {
    local any=0
    for n in "${names[@]}"; do
        local pidfile="$dir/$n.pid"
        [ -f "$pidfile" ] || continue
        any=1
        local pid
        pid="$(cat "$pidfile")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid"
            for _ in $(seq 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$pidfile"
    done
    for n in "${names[@]}"; do
        rm -rf "${dir:?}/$n.data" "${dir:?}/$n.log"
    done
    rmdir "$dir" 2>/dev/null || true
    if ((any)); then log "stopped and removed data in $dir"; else log "nothing running in $dir"; fi
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    status) etcdctl --endpoints="$endpoints" endpoint status -w table ;;
    check) check_ports ;;
    *)
        echo "usage: $0 {start|status|stop|check} [DIR]" >&2
        exit 2
        ;;
esac
