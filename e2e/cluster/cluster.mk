# Local single-node Kubernetes for e2e tests (docs/local-cluster.md describes it).
# Included by the top-level Makefile:  include e2e/cluster/cluster.mk
E2E_CLUSTER := e2e/cluster
E2E_PYTEST ?= python3 -m pytest
KIND_CLUSTER ?= rlog-e2e
# empty: build the kind node image from local parts (docs/kind.md); an upstream image such as
# kindest/node:v1.34.0 needs registry access and uses the machine's own docker
KIND_NODE_IMAGE ?=

.PHONY: cluster-up cluster-down cluster-status images e2e-smoke e2e-local e2e-kind e2e-kind-nodes e2e-netpol

cluster-up:        ## build what is missing, start a local Kubernetes, context rlog-local
	bash $(E2E_CLUSTER)/up.sh

cluster-down:      ## stop the local Kubernetes and clean everything it made
	bash $(E2E_CLUSTER)/down.sh

cluster-status:    ## show the local Kubernetes' components, node and pods
	bash $(E2E_CLUSTER)/status.sh

images:            ## build the project's images (Dockerfiles) and load them into the local cluster
	bash $(E2E_CLUSTER)/images.sh all

e2e-smoke:         ## smoke suite against the current kubeconfig context
	$(E2E_PYTEST) e2e/smoke -v

e2e-local:         ## CI: the local cluster up (warm: ~1-2 min), then the smoke suite on it
	$(MAKE) cluster-up
	$(MAKE) e2e-smoke

e2e-netpol:        ## kube-router added to the running local cluster, then the NetworkPolicy e2e (denials)
	RLOG_NETPOL_AGENT=1 bash $(E2E_CLUSTER)/up.sh
	$(E2E_PYTEST) e2e/operator/test_network_policy.py -v

e2e-kind:          ## kind from local parts (or KIND_NODE_IMAGE=kindest/node:...), images loaded, smoke + operator suites
	KIND_NODE_IMAGE=$(KIND_NODE_IMAGE) KIND_CLUSTER=$(KIND_CLUSTER) E2E_PYTEST="$(E2E_PYTEST)" bash e2e/kind/e2e.sh

e2e-kind-nodes:    ## kind with 3 nodes (control plane + 2 workers): the multi-node tests (spread, partition, node lost)
	KIND_NODE_IMAGE=$(KIND_NODE_IMAGE) KIND_CLUSTER=rlog-nodes KIND_WORKERS=2 E2E_KIND_SUITES=nodes \
	  E2E_PYTEST="$(E2E_PYTEST)" bash e2e/kind/e2e.sh
