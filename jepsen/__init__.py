"""rlog's Jepsen-style consistency suite.

Concurrent clients append and read through real replica processes while a nemesis injects
faults (SIGSTOP, SIGKILL and restart, network partitions); every operation is recorded with
its invoke and complete times on one monotonic clock, and the history is judged by an
independent linearizability checker (Porcupine, in `jepsen/checker`) against a model of
the log, beside direct checks of the replicas' logs after healing. See docs/jepsen.md.

    python -m jepsen --runs 3 --seconds 20 --nemesis partition-leader
"""
