#!/usr/bin/env bash
# The host's netfilter and routing state, to show that the private dockerd and the kind
# nodes leave it alone:
#   netcheck.sh save NAME     write it to $KIND_CACHE/netcheck/NAME
#   netcheck.sh diff A B      exit 1 (and show the difference) if A and B differ
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
    exit $rc ;;
  *) die "usage: netcheck.sh save NAME | diff A B" ;;
esac
