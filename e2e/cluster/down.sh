#!/usr/bin/env bash
# Tear the local cluster down: stop every process it started (by pid), kill pod containers,
# unmount, remove iptables chains, cni0, cgroups and state. Safe to run any number of times,
# also after a killed `up.sh`.  --quiet: say nothing when there is nothing to do.
source "$(dirname "$0")/lib.sh"
QUIET=0; [[ ${1:-} == --quiet ]] && QUIET=1
say() { ((QUIET)) || log "$@"; }

# pids of our daemons: from the pid files, plus any whose binary lives in our cache or whose
# command line names our state (covers a run killed before it wrote a pid file)
daemon_pids() {
  local name=$1 f=$RUN/$1.pid p exe
  { if [[ -f $f ]]; then p=$(cat "$f"); [[ -d /proc/$p ]] && echo "$p"; fi
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
    case $exe in
      "$CACHE"/*/bin/"$name") echo "$p" ;;
      */containerd) [[ $name == containerd ]] && tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" |
                      grep -q -- "$STATE/containerd.toml" && echo "$p" ;;
    esac
  done; } | sort -u | while read -r p; do
    grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null || echo "$p"   # zombies are dead already
  done
}
stop_pids() { # SIGNAL-ESCALATING stop of the given pids
  local pids=("$@") p
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 40); do
    local alive=0
    for p in "${pids[@]}"; do [[ -d /proc/$p ]] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.25
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}
descendants() { # PID -> all descendant pids
  local kids; kids=$(ps -o pid= --ppid "$1" 2>/dev/null) || return 0
  for k in $kids; do echo "$k"; descendants "$k"; done
}

did=0
# 0. builders of an earlier, killed up.sh (images.sh, build-*.sh, their go/docker children)
#    and our private dockerd, which must never outlive an image build
ancestors=" $$ "; a=$$
while a=$(ps -o ppid= -p "$a" 2>/dev/null | tr -d ' ') && [[ -n $a && $a != 0 ]]; do ancestors+="$a "; done
for p in /proc/[0-9]*; do
  p=${p#/proc/}; [[ $ancestors == *" $p "* ]] && continue
  mapfile -d '' -t argv 2>/dev/null < "/proc/$p/cmdline" || continue
  [[ ${argv[0]:-} == bash || ${argv[0]:-} == */bash ]] || continue
  script=${argv[1]:-}
  case $script in up.sh|images.sh|build-k8s.sh|build-tools.sh|*/up.sh|*/images.sh|*/build-k8s.sh|*/build-tools.sh) ;; *) continue ;; esac
  [[ $script == /* ]] || script=$(readlink "/proc/$p/cwd" 2>/dev/null)/$script
  [[ $(cd "$(dirname "$script")" 2>/dev/null && pwd -P) == "$(cd "$HERE" && pwd -P)" ]] || continue
  mapfile -t kids < <(descendants "$p")
  say "stopping a stale builder ($p: ${argv[*]:0:3})"
  kill -KILL "$p" "${kids[@]}" 2>/dev/null || true; did=1
done
mapfile -t dpids < <({ cat /run/rlog-docker/dockerd.pid 2>/dev/null; for p in /proc/[0-9]*; do
  tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -q -- "^dockerd --data-root $CACHE/docker " && echo "${p#/proc/}"; done; } | sort -u)
for p in "${dpids[@]}"; do [[ -d /proc/$p ]] || continue; say "stopping our dockerd ($p)"; stop_pids "$p"; did=1; done
awk '$2 ~ "^/run/rlog-docker" || index($2, "'"$CACHE"'/docker/") == 1 {print $2}' /proc/mounts | sort -r |
  xargs -r -n1 umount -l 2>/dev/null || true
if ((${#dpids[@]})); then
  for d in /sys/fs/cgroup/*/docker; do [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null; done
fi

# 1. node agents first, so nothing restarts containers
for d in local-path-provisioner coredns kube-proxy kubelet; do
  mapfile -t pids < <(daemon_pids "$d")
  ((${#pids[@]})) && { say "stopping $d (${pids[*]})"; stop_pids "${pids[@]}"; did=1; }
done
# 2. pod containers: every containerd shim of our socket, and what runs under it
mapfile -t shims < <(for p in /proc/[0-9]*; do
  tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -q -- "-address $CTRD_SOCK" && echo "${p#/proc/}"; done)
if ((${#shims[@]})); then
  say "killing pod containers (${#shims[@]} shims)"
  for s in "${shims[@]}"; do mapfile -t kids < <(descendants "$s"); ((${#kids[@]})) && kill -KILL "${kids[@]}" 2>/dev/null; done
  sleep 0.5; stop_pids "${shims[@]}"; did=1
fi
# ... and whatever still runs in the kubelet's pod cgroups (a shim killed earlier leaves its
# containers behind, reparented to init)
for round in 1 2 3; do
  mapfile -t orphans < <(cat /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u)
  ((${#orphans[@]})) || break
  ((round == 1)) && say "killing ${#orphans[@]} leftover pod processes"
  kill -KILL "${orphans[@]}" 2>/dev/null || true; did=1; sleep 0.5
done

# 3. containerd and the control plane
for d in containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do
  mapfile -t pids < <(daemon_pids "$d")
  ((${#pids[@]})) && { say "stopping $d (${pids[*]})"; stop_pids "${pids[@]}"; did=1; }
done

# 4. mounts: kubelet volumes (tmpfs, binds), overlay rootfs, sandbox netns, shm
mapfile -t mnts < <(awk '{print $2}' /proc/mounts | grep -E "^($STATE|/run/rlog-cluster|/run/netns/cni-|/var/run/netns/cni-)" | sort -r)
for m in "${mnts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
((${#mnts[@]})) && { say "unmounted ${#mnts[@]} mounts"; did=1; }
rm -f /run/netns/cni-* 2>/dev/null || true

# 5. network: kube-proxy's and kube-router's chains (KUBE-*), CNI chains, our egress guard,
#    kube-router's ipsets, cni0, the DNS address
if [[ -x $K8S_BIN/kube-proxy ]] && iptables-save 2>/dev/null | grep -q KUBE-; then
  "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
for t in filter nat mangle; do
  rules=$(iptables -t "$t" -S 2>/dev/null | grep -E '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j (CNI-|RLOG-|KUBE-)' || true)
  while read -r r; do [[ -n $r ]] && eval "iptables -t $t ${r/-A /-D }" 2>/dev/null && did=1; done <<<"$rules"
  for c in $(iptables -t "$t" -S 2>/dev/null | awk '$1=="-N" && $2 ~ /^(CNI-|RLOG-|KUBE-)/ {print $2}'); do
    iptables -t "$t" -F "$c" 2>/dev/null || true
  done
  for c in $(iptables -t "$t" -S 2>/dev/null | awk '$1=="-N" && $2 ~ /^(CNI-|RLOG-|KUBE-)/ {print $2}'); do
    iptables -t "$t" -X "$c" 2>/dev/null || true
  done
done
# kube-router's ipsets, once no rule refers to them any more
if command -v ipset >/dev/null; then
  for s in $(ipset list -n 2>/dev/null | grep -E '^(inet6:)?(KUBE-(SRC|DST)-|kube-router-|TMP-)'); do
    ipset destroy "$s" 2>/dev/null && did=1 || true
  done
fi
ip link show cni0 >/dev/null 2>&1 && { ip link del cni0; say "deleted cni0"; did=1; }
ip -o link show type veth 2>/dev/null | awk -F'[ :@]+' '$2 ~ /^veth/ {print $2}' | while read -r v; do
  [[ $(ip -d link show "$v" 2>/dev/null) == *"master cni0"* ]] && ip link del "$v" 2>/dev/null; done || true
ip addr del "$DNS_IP/32" dev lo 2>/dev/null && did=1 || true

# 6. cgroups the kubelet made (cgroupfs driver): depth-first rmdir
for ctl in /sys/fs/cgroup/*/; do
  for top in "$ctl"kubepods "$ctl"kubepods.slice; do
    [[ -d $top ]] || continue
    find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [[ -d $top ]] && say "WARNING: $top still busy" || did=1
  done
done

# 7. state (caches stay; the last run's logs go to $LOGS/last-run), kubeconfig context
if [[ -d $RUN ]]; then
  rm -rf "$LOGS/last-run"; mkdir -p "$LOGS/last-run"; cp "$RUN"/*.log "$LOGS/last-run/" 2>/dev/null || true
fi
if [[ -d $STATE || -d /run/rlog-cluster ]]; then
  rm -rf "$STATE" /run/rlog-cluster 2>/dev/null || { sleep 1; rm -rf "$STATE" /run/rlog-cluster; }
  did=1
fi
if [[ -f $HOME/.kube/config ]] && command -v kubectl >/dev/null; then
  if KUBECONFIG=$HOME/.kube/config kubectl config get-contexts -o name 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
    KUBECONFIG=$HOME/.kube/config kubectl config delete-context "$CLUSTER_NAME" >/dev/null 2>&1 || true
    KUBECONFIG=$HOME/.kube/config kubectl config delete-cluster "$CLUSTER_NAME" >/dev/null 2>&1 || true
    KUBECONFIG=$HOME/.kube/config kubectl config delete-user "$CLUSTER_NAME-admin" >/dev/null 2>&1 || true
    [[ $(KUBECONFIG=$HOME/.kube/config kubectl config current-context 2>/dev/null) == "" ]] &&
      KUBECONFIG=$HOME/.kube/config kubectl config unset current-context >/dev/null 2>&1 || true
  fi
fi
((did)) && say "cluster $CLUSTER_NAME is down" || say "nothing to clean up"
exit 0
