#!/bin/bash
# The container side of Spark on Kubernetes. Spark starts this image with `driver ARGS...`
# (the driver pod of a cluster-mode submission: spark-submit again, now in client mode inside
# the pod) or `executor` (an executor pod: its settings come as SPARK_* variables). Anything
# else runs as a command, e.g. `spark-submit ...` or `python3 ...`.
set -euo pipefail

case ${1:-} in
  driver)
    shift
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # The driver passes the executor's JVM options (the Java 17 module openings among them)
    # as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
    java_opts=()
    while IFS= read -r name; do java_opts+=("${!name}"); done < <(
      compgen -v SPARK_JAVA_OPT_ | sort -t_ -k4 -n)
    exec "$JAVA_HOME/bin/java" "${java_opts[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_HOME/conf:$SPARK_HOME/jars/*${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  "") exec /bin/bash ;;
  *) exec "$@" ;;
esac
