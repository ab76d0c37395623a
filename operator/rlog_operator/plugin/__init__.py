"""`kubectl rlog`: a kubectl plugin over the ReplicatedLog's documented annotations and
status, for people (the operator never imports it). It runs with the user's own
credentials, so it is not held to the operator's RBAC or its one `kube` module.

- `cli.py`: the arguments, the commands, `main` (the `kubectl-rlog` console script);
- `patches.py`: what each command asks of the cluster, built from what was read (pure);
- `views.py`: what `status` and `version` print: a table, or JSON/YAML with `-o` (pure);
- `report.py`: `version`, `logs` and `report`, gathered from several objects;
- `cluster.py`: the few API calls, through the kubernetes client;
- `completion.py`: `kubectl_complete-rlog`, kubectl's shell completion for the plugin.
"""
