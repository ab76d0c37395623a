#!/usr/bin/env bash
# Replay a ReplicatedLog into Parquet with Spark on Kubernetes: examples/spark_replay.py,
# submitted in cluster mode (driver and executors are pods of the Spark image), reading the
# log through its client Service, writing to the volume rlog-spark-out mounted at /out.
#
#   examples/spark_k8s/spark-submit.sh LOG [spark_replay.py args...]
#   examples/spark_k8s/spark-submit.sh orders --out /out/orders --partitions 16
#   examples/spark_k8s/spark-submit.sh orders --out /out/orders-stream --stream --max-entries 5000
#
# Before: kubectl apply -f rbac.yaml -f output-pvc.yaml (the driver's ServiceAccount and the
# output volume), the Secret LOG-spark-client with a certificate the log's roles let read
# (log.yaml's spec.auth.clients: the operator issues it); the Spark image
# docker.io/rlog/rlog-spark:dev on the nodes (make
# e2e-spark-k8s builds and imports it on the local cluster). Settings (environment):
#   NAMESPACE     the log's namespace, where the pods run (default: the context's, else default)
#   MASTER        k8s://<API server> (default: the current context's server)
#   IMAGE         the Spark image (default docker.io/rlog/rlog-spark:dev)
#   EXECUTORS     executor pods (default 2), each with EXECUTOR_MEMORY (512m) and one task slot
#   PVC           the output claim (default rlog-spark-out), mounted at /out
#   CLIENT_SECRET the client certificate's Secret (default LOG-spark-client; none: plaintext)
#   APP_NAME      Spark's application name, the pods' name prefix (default rlog-replay-LOG)
#   SPARK_SUBMIT  the spark-submit to run (default: the one on the PATH, e.g. pip's pyspark)
# The driver and executor pods carry the label rlog-client=LOG, which log.yaml's
# spec.networkPolicy.clients admits. spark-submit waits for the driver; this script then
# exits 1 unless the driver pod Succeeded; `kubectl logs <APP_NAME>-driver` shows what the
# job printed.
set -euo pipefail

LOG=${1:?usage: spark-submit.sh LOG [spark_replay.py args...]}
shift
NAMESPACE=${NAMESPACE:-$(kubectl config view --minify -o jsonpath='{..namespace}')}
NAMESPACE=${NAMESPACE:-default}
MASTER=${MASTER:-k8s://$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')}
IMAGE=${IMAGE:-docker.io/rlog/rlog-spark:dev}
EXECUTORS=${EXECUTORS:-2}
EXECUTOR_MEMORY=${EXECUTOR_MEMORY:-512m}
PVC=${PVC:-rlog-spark-out}
CLIENT_SECRET=${CLIENT_SECRET-$LOG-spark-client}
APP_NAME=${APP_NAME:-rlog-replay-$LOG}
SPARK_SUBMIT=${SPARK_SUBMIT:-spark-submit}

conf=(
  spark.kubernetes.namespace="$NAMESPACE"
  spark.kubernetes.container.image="$IMAGE"
  spark.kubernetes.container.image.pullPolicy=IfNotPresent
  spark.kubernetes.authenticate.driver.serviceAccountName=rlog-spark
  spark.kubernetes.driver.pod.name="$APP_NAME-driver"
  spark.kubernetes.executor.podNamePrefix="$APP_NAME"
  spark.kubernetes.driver.label.rlog-client="$LOG"
  spark.kubernetes.executor.label.rlog-client="$LOG"
  spark.executor.instances="$EXECUTORS"
  spark.executor.cores=1
  spark.executor.memory="$EXECUTOR_MEMORY"
  spark.driver.memory=512m
  # Spark retries a failed task at once; give a log that is briefly unavailable (its
  # replicas restarting: seen on a 2-core node under load) more than the default 4 tries
  spark.task.maxFailures=10
  # small requests: Spark asks one CPU per pod by default, more than a small node has spare
  spark.kubernetes.driver.request.cores=0.1
  spark.kubernetes.executor.request.cores=0.1
  # the output volume, the same claim in every pod
  spark.kubernetes.driver.volumes.persistentVolumeClaim.out.options.claimName="$PVC"
  spark.kubernetes.driver.volumes.persistentVolumeClaim.out.mount.path=/out
  spark.kubernetes.executor.volumes.persistentVolumeClaim.out.options.claimName="$PVC"
  spark.kubernetes.executor.volumes.persistentVolumeClaim.out.mount.path=/out
  # the driver's own messages (spark_replay.py prints what it wrote) stay in its pod's log
  spark.kubernetes.submission.waitAppCompletion=true
)
if [[ -n $CLIENT_SECRET ]]; then
  # the client certificate, in every pod, as the RLOG_* variables rlog.client reads
  conf+=(
    spark.kubernetes.driver.secrets."$CLIENT_SECRET"=/etc/rlog/client
    spark.kubernetes.executor.secrets."$CLIENT_SECRET"=/etc/rlog/client
  )
  for v in RLOG_CA=ca.crt RLOG_CERT=tls.crt RLOG_KEY=tls.key; do
    conf+=(spark.kubernetes.driverEnv."${v%%=*}"=/etc/rlog/client/"${v#*=}"
           spark.executorEnv."${v%%=*}"=/etc/rlog/client/"${v#*=}")
  done
fi

args=()
for c in "${conf[@]}"; do args+=(--conf "$c"); done
"$SPARK_SUBMIT" --master "$MASTER" --deploy-mode cluster --name "$APP_NAME" "${args[@]}" \
  local:///opt/rlog/examples/spark_replay.py --endpoints "$LOG.$NAMESPACE.svc:7000" "$@"
# spark-submit exits 0 in cluster mode even when the driver failed: the driver pod says
phase=$(kubectl -n "$NAMESPACE" get pod "$APP_NAME-driver" -o jsonpath='{.status.phase}')
if [[ $phase != Succeeded ]]; then
  echo "driver $APP_NAME-driver: $phase (kubectl -n $NAMESPACE logs $APP_NAME-driver)" >&2
  exit 1
fi
