"""The replica runtime: the pure protocol wrapped with disk, network and timers.

- `node`: one replica process's state and the drivers of the protocol's outputs;
- `errors`: `RpcError`, the error a replica answers a request with, and its reason;
- `journal`: group commit of durable batches;
- `catchup`: copying and filling a recovering replica's missing positions;
- `server`: the gRPC services over a node;
- `metrics`: the replica's Prometheus metrics.
"""
