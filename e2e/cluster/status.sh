#!/usr/bin/env bash
# Status of the local cluster. Exit 0 when every component runs and the API answers.
#   --short: one line
source "$(dirname "$0")/lib.sh"
SHORT=0; [[ ${1:-} == --short ]] && SHORT=1
ok=1; line=""
for d in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns local-path-provisioner; do
  f=$RUN/$d.pid
  if [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null; then s="running (pid $(cat "$f"))"; line+="$d=up "
  else s="NOT RUNNING"; ok=0; line+="$d=down "; fi
  ((SHORT)) || printf '%-24s %s\n' "$d" "$s"
done
if ((ok)); then
  K=("$K8S_BIN/kubectl" --kubeconfig "$KCFG/admin.kubeconfig" --request-timeout=5s)
  if "${K[@]}" get --raw /readyz >/dev/null 2>&1; then
    # the NetworkPolicy agent (a DaemonSet): shown, not required (up.sh adds it when missing)
    if "${K[@]}" -n kube-system rollout status daemonset/kube-router --timeout=1s >/dev/null 2>&1
    then line+="kube-router=ready "; else line+="kube-router=not-ready "; fi
    ((SHORT)) || { echo; "${K[@]}" get nodes -o wide; echo; "${K[@]}" get pods -A -o wide; echo; "${K[@]}" get sc,pv; }
  else ok=0; line+="api=not-ready"; ((SHORT)) || echo "kube-apiserver: not ready"; fi
fi
((SHORT)) && echo "$CLUSTER_NAME: $line"
((ok)) || { ((SHORT)) || echo "cluster $CLUSTER_NAME is not (fully) up"; exit 1; }
