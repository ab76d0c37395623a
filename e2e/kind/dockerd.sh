#!/usr/bin/env bash
# The private Docker daemon the kind nodes run in.
#   dockerd.sh start    start it (idempotent) and make sure the `kind` bridge network exists
#   dockerd.sh stop     stop it, unmount what it left
#   dockerd.sh env      print `export DOCKER_HOST=...` for a shell
# Beside the local cluster (e2e/cluster) only a dockerd that leaves the host's netfilter
# alone may run: a default dockerd adds DOCKER chains and sets the FORWARD policy to DROP,
# which cuts pod traffic. This one has no default bridge, writes no iptables or ip6tables
# rules, does not touch ip_forward and masquerades nothing; the kind nodes live on one
# user-defined bridge ($KIND_NET_BRIDGE, $KIND_NET_SUBNET) that the host reaches directly,
# and the API server's published port is served by docker-proxy (a userland listener on
# 127.0.0.1), not by DNAT rules. netcheck.sh shows the host's state is unchanged.
# Every container runs through runc-nosysres (see there: root here lacks CAP_SYS_RESOURCE).
source "$(dirname "$0")/lib.sh"

D=(docker -H "$KIND_DOCKER_SOCK")
PIDFILE=$KIND_DOCKER_RUN/dockerd.pid

running() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && "${D[@]}" version >/dev/null 2>&1; }

start() {
  if running; then log "private dockerd: running (pid $(cat "$PIDFILE"))"; else
    command -v dockerd >/dev/null || die "dockerd missing: apt-get install docker.io"
    mkdir -p "$KIND_DOCKER_RUN" "$KIND_DOCKER_ROOT"
    # /lib/modules is bind-mounted into every kind node; this VM has none, so make it empty.
    mkdir -p /lib/modules
    setsid dockerd --data-root "$KIND_DOCKER_ROOT" --exec-root "$KIND_DOCKER_RUN/exec" \
      -H "$KIND_DOCKER_SOCK" --pidfile "$PIDFILE" \
      --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
      --default-address-pool "base=$KIND_NET_SUBNET,size=24" \
      --storage-driver=overlay2 \
      --add-runtime "rlog-nosysres=$KIND_HERE/runc-nosysres" --default-runtime rlog-nosysres \
      > "$KIND_LOGS/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 120); do running && break; sleep 0.5; done
    running || die "private dockerd did not start: $(tail -5 "$KIND_LOGS/dockerd.log")"
    log "private dockerd: started (pid $(cat "$PIDFILE"), $KIND_DOCKER_SOCK)"
  fi
  if ! "${D[@]}" network inspect "$KIND_NET" >/dev/null 2>&1; then
    "${D[@]}" network create -d bridge --subnet "$KIND_NET_SUBNET" \
      -o com.docker.network.bridge.name="$KIND_NET_BRIDGE" \
      -o com.docker.network.bridge.enable_ip_masquerade=false "$KIND_NET" >/dev/null
    log "private dockerd: network $KIND_NET ($KIND_NET_SUBNET on $KIND_NET_BRIDGE) created"
  fi
}

stop() {
  local pid
  if [[ -f $PIDFILE ]] && pid=$(cat "$PIDFILE") && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { log "private dockerd: still running after 60 s, SIGKILL"; kill -9 "$pid"; }
    log "private dockerd: stopped"
  else
    log "private dockerd: not running"
  fi
  rm -f "$PIDFILE"
  # its containerd and shims exit with it; leave no mounts of ours behind
  awk -v a="$KIND_DOCKER_RUN" -v b="$KIND_DOCKER_ROOT/" \
    'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/mounts |
    sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  ip link show "$KIND_NET_BRIDGE" >/dev/null 2>&1 && ip link delete "$KIND_NET_BRIDGE" 2>/dev/null || true
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  env) echo "export DOCKER_HOST=$KIND_DOCKER_SOCK" ;;
  status) if running; then echo "running (pid $(cat "$PIDFILE"))"; else echo "not running"; exit 1; fi ;;
  *) die "usage: dockerd.sh start|stop|status|env" ;;
esac
