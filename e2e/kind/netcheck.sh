#!/usr/bin/env bash
# The host's netfilter and routing state, to show that the private dockerd and the kind
# nodes leave it alone:
#   netcheck.sh save NAME     write it to $KIND_CACHE/netcheck/NAME
#   netcheck.sh diff A B      exit 1 (and show the difference) if A and B differ, or if B has
#                             Docker chains or rules naming the kind network
# Saved: iptables-save, ip6tables-save, `nft list ruleset` (packet counters removed), the
# ip_forward and bridge netfilter sysctls, and the main routing table and policy rules
# (without the kind bridge's own connected route).
# Links and addresses are saved too but left out of the diff: the kind bridge (rlogkind0)
# and the nodes' veth pairs come and go with the cluster.
source "$(dirname "$0")/lib.sh"
D=$KIND_CACHE/netcheck
mkdir -p "$D"

save() {
  local out=$D/$1; mkdir -p "$out"
  { iptables-save; echo ---; ip6tables-save; } 2>&1 | { grep -v '^#' || true; } |
    sed -E 's/\[[0-9]+:[0-9]+\]/[c]/' > "$out/iptables"
  nft list ruleset 2>&1 | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/' > "$out/nft"
  sysctl net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding \
    net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables > "$out/sysctl" 2>&1 || true
  # (the kind bridge's own connected routes excepted)
  { ip route show table main; ip -6 route show table main; ip rule; } 2>&1 |
    { grep -v -e "dev $KIND_NET_BRIDGE " -e '^fe80' || true; } > "$out/routes"
  { ip -o link; ip -o addr; } > "$out/links" 2>&1
  log "netcheck: saved $out ($(wc -l < "$out/iptables") iptables lines, $(wc -l < "$out/nft") nft lines)"
}

case ${1:-} in
  save) save "${2:?name}" ;;
  diff)
    rc=0
    for f in iptables nft sysctl routes; do
      diff -u "$D/${2:?a}/$f" "$D/${3:?b}/$f" || rc=1
    done
    if ((rc)); then log "netcheck: $2 and $3 DIFFER"; else log "netcheck: $2 and $3 identical (iptables, ip6tables, nft, sysctls, routes)"; fi
    # Whatever else changed (a running local cluster's kube-proxy rewrites its own chains),
    # nothing of Docker or of the kind network may be in the host's rules.
    if grep -E -e 'DOCKER' -e "${KIND_NET_SUBNET%.*}\." -e "$KIND_NET_BRIDGE" "$D/$3/iptables" "$D/$3/nft"; then
      log "netcheck: $3 has Docker or kind rules"; rc=1
    else log "netcheck: $3 has no Docker chains and no rule naming $KIND_NET_SUBNET or $KIND_NET_BRIDGE"; fi
    for s in "$2" "$3"; do log "netcheck: $s: $(grep -E '^:(FORWARD|INPUT|OUTPUT) ' "$D/$s/iptables" | head -3 | tr '\n' ' ')"; done
    exit $rc ;;
  check) # NAME: only the Docker/kind test on one saved state
    ! grep -E -e 'DOCKER' -e "${KIND_NET_SUBNET%.*}\." -e "$KIND_NET_BRIDGE" "$D/${2:?name}/iptables" "$D/$2/nft" ;;
  *) die "usage: netcheck.sh save NAME | diff A B" ;;
esac
