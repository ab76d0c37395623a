"""The replica runtime: the pure protocol wrapped with disk, network and timers.

- `node`: one replica process's state and the drivers of the protocol's outputs (the
  acceptor/learner handlers, the coordinator's outputs, the election, the client API);
- `peers`: the other replicas' channels, sending them protocol messages, learned
  piggy-backing, and copying learned entries (`Fetch`);
- `recover`: recover rounds until a replica that is not VOTING may vote;
- `catchup`: copying and filling a recovering replica's missing positions;
- `forwarding`: passing a follower's appends, truncations and reads to the leader;
- `journal`: group commit of durable batches;
- `errors`: the errors a replica answers its clients with;
- `server`: the gRPC services over a node;
- `metrics`: the replica's Prometheus metrics.

`node` imports the others; none of them imports `node`.
"""
