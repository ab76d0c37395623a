"""rlog_operator: the kopf operator that runs ReplicatedLogs on Kubernetes."""
