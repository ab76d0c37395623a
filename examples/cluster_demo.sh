#!/usr/bin/env bash
# The main job on a real Kubernetes (the current kubeconfig context; `make demo` first brings
# up the project's local cluster with freshly built images): helm-install the operator, apply
# examples/replicatedlog.yaml, wait until the log is Ready, append and read entries through
# the log's client Service, then print `kubectl get rlog` and the log's status.
#
# Usage: examples/cluster_demo.sh            (namespace: $RLOG_DEMO_NAMESPACE, default rlog-demo)
# Re-running is safe: the release is upgraded, the log kept, more entries appended.
# Clean up: kubectl delete ns rlog-demo (the operator's finalizer needs the operator running,
# so delete the ReplicatedLog before `helm uninstall`), or `make cluster-down`.
set -euo pipefail
cd "$(dirname "$0")/.."
NS=${RLOG_DEMO_NAMESPACE:-rlog-demo}
LOG=demo
SVC="$LOG:7000"   # the client Service (any VOTING replica; appends are forwarded to the leader)

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "$*"; "$@"; }

run helm upgrade --install rlog-operator helm/rlog-operator --namespace "$NS" --create-namespace \
  --set image.pullPolicy=IfNotPresent --set replicaImage.pullPolicy=IfNotPresent \
  --set "watchNamespaces={$NS}" --wait --timeout 180s
run kubectl -n "$NS" rollout status deployment/rlog-operator --timeout=180s
run kubectl -n "$NS" apply -f examples/replicatedlog.yaml

say "kubectl -n $NS wait rlog/$LOG --for=jsonpath='{.status.phase}'=Ready --timeout=300s"
if ! kubectl -n "$NS" wait "rlog/$LOG" --for=jsonpath='{.status.phase}'=Ready --timeout=300s; then
  kubectl -n "$NS" get rlog,pods,pvc -o wide || true
  kubectl -n "$NS" describe rlog "$LOG" | tail -30 || true
  kubectl -n "$NS" logs deployment/rlog-operator --tail=40 || true
  echo "the ReplicatedLog did not become Ready in 300 s" >&2
  exit 1
fi

# A fresh log sometimes holds a second election just after turning Ready; an append in
# flight then fails with an unknown outcome. Wait until every replica names the same leader
# and no replica's promise moves for a few seconds.
views() {  # one line per replica: its leader and its promise
  for i in 0 1 2; do
    kubectl -n "$NS" exec "$LOG-$i" -c replica -- rlog status --endpoint 127.0.0.1:7000 --json |
      python3 -c 'import json, sys; s = json.load(sys.stdin); print(s["leader"], s["promised"])'
  done
}
for _ in $(seq 30); do
  a=$(views); sleep 3; b=$(views)
  [[ $a == "$b" && $(cut -d' ' -f1 <<<"$a" | sort -u | wc -l) == 1 && -n $(cut -d' ' -f1 <<<"$a" | head -1) ]] && break
done

# The client runs in the cluster (the Service is a cluster address): the rlog CLI of a
# replica pod, talking to the Service like any client would.
rlog() { kubectl -n "$NS" exec "$LOG-0" -c replica -- rlog "$@"; }
say "rlog append --endpoint $SVC hello replicated log   (in pod $LOG-0)"
rlog append --endpoint "$SVC" hello replicated log
say "rlog append --endpoint $SVC entry-\$(date +%s)"
rlog append --endpoint "$SVC" "entry-$(date +%s)"
say "rlog read --endpoint $SVC"
rlog read --endpoint "$SVC"
for i in 0 1 2; do
  say "rlog status --endpoint $LOG-$i.$LOG-headless:7000"
  rlog status --endpoint "$LOG-$i.$LOG-headless:7000"
done

run kubectl -n "$NS" get rlog
say "kubectl -n $NS get rlog $LOG -o jsonpath='{.status}'"
kubectl -n "$NS" get rlog "$LOG" -o jsonpath='{.status}' | python3 -m json.tool
