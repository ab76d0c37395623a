#!/usr/bin/env bash
# make e2e-kind: a kind cluster, the project's images loaded into it, then the smoke suite
# and the operator suite (the selection `make e2e-operator` runs) against it.
#   KIND_NODE_IMAGE=kindest/node:v1.34.0   use an upstream node image (needs a registry) and
#                                          the machine's own docker instead of building one
#   KIND_KEEP=1                            leave the cluster (and the private dockerd) up
#   E2E_PYTEST                             how to run pytest (the Makefile passes the venv's)
#   E2E_KIND_SUITES                        what to run (default: "smoke operator"; "nodes":
#                                          the multi-node tests, with KIND_WORKERS=2)
#   KIND_WORKERS                           worker nodes beside the control plane (default 0)
# Each step logs its elapsed time; docs/kind.md has the measured ones.
source "$(dirname "$0")/lib.sh"
T0=$SECONDS
step() { log "== $* (t=$((SECONDS - T0))s)"; }
PYTEST=${E2E_PYTEST:-python3 -m pytest}
SUITES=${E2E_KIND_SUITES:-smoke operator}
LOCAL=0; [[ -z $KIND_NODE_IMAGE ]] && LOCAL=1

finish() {
  local rc=$?
  if [[ ${KIND_KEEP:-0} != 1 ]]; then
    step "teardown"
    "$KIND_HERE/cluster.sh" delete || true
    ((LOCAL)) && "$KIND_HERE/dockerd.sh" stop || true
    if ((LOCAL)); then
      "$KIND_HERE/netcheck.sh" save after >/dev/null 2>&1 || true
      "$KIND_HERE/netcheck.sh" diff before after || log "the host's netfilter/routing state changed during the run (the local cluster's kube-proxy, if it runs, changes it too)"
    fi
  fi
  log "e2e-kind: exit $rc after $((SECONDS - T0))s"
}
trap finish EXIT

if ((LOCAL)); then
  # netcheck needs nft; the node image is built with debootstrap and run by a private dockerd
  step "host packages"
  ensure_packages nftables debootstrap docker.io iptables
  "$KIND_HERE/netcheck.sh" save before
fi
step "kind $KIND_VERSION"
"$KIND_HERE/install-kind.sh"
if ((LOCAL)); then
  step "node parts (Kubernetes binaries with kubeadm, etcd, CoreDNS, local-path-provisioner, pause)"
  K8S_WITH_KUBEADM=1 "$HERE/build-k8s.sh"
  "$HERE/build-tools.sh"
fi
step "project images (e2e/cluster/images.sh build)"
"$HERE/images.sh" build 1
step "kind cluster"
"$KIND_HERE/cluster.sh" create
step "load images"
"$KIND_HERE/cluster.sh" load

export KUBECONFIG=$KIND_CACHE/kubeconfig
# kubectl and helm: the ones on the PATH, else the local cluster's builds
command -v kubectl >/dev/null || export PATH=$K8S_BIN:$PATH
command -v helm >/dev/null || { [[ -x $HELM_BIN/helm ]] || "$HERE/build-tools.sh"; export PATH=$HELM_BIN:$PATH; }
kubectl get nodes -o wide >&2
cd "$REPO"
rc=0
for s in $SUITES; do
  case $s in
    smoke) step "e2e smoke suite"; $PYTEST e2e/smoke -v || rc=1 ;;
    operator) step "e2e operator suite"
      $PYTEST e2e/operator -v --durations=0 -m "not extended and not cert_manager and not spark_k8s and not nodes" || rc=1 ;;
    nodes) step "e2e node suite ($((KIND_WORKERS + 1)) nodes)"
      # the node tests' faults act on the node containers through the private dockerd
      KIND_DOCKER_HOST=$(kind_docker_host) $PYTEST e2e/operator -v --durations=0 -m nodes || rc=1 ;;
    *) die "unknown suite $s (smoke, operator, nodes)" ;;
  esac
done
step "suites done (rc=$rc)"
exit $rc
