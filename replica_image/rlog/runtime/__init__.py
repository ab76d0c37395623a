"""The replica runtime: the pure protocol wrapped with disk, network and timers.

- `node`: one replica process: builds the drivers below, wires them together, starts,
  supervises and stops their loops; it decides nothing of its own;
- the drivers of the protocol's rules, each named after its rule (rlog.protocol):
  `replica` (the acceptor/learner handlers), `coordinator` (the coordinator's inputs and
  outputs, the client's writes), `admission`, `election` (the election loop, check-quorum,
  heartbeats), `read_index` (where the leader confirms a read), `recover` (recover rounds
  until a replica that is not VOTING may vote);
- `catchup`: copying and filling a recovering replica's missing positions;
- `reads`: the client's reads and tails; `pulls`: a VOTING replica copying what it missed;
- `repair`: a corrupt record dropped and recovered, a full disk refusing appends;
- `peers`: the other replicas' channels, sending them protocol messages, learned
  piggy-backing, and copying learned entries (`Fetch`);
- `forwarding`: passing a follower's appends, truncations and reads to the leader;
- `journal`: group commit of durable batches;
- `errors`: the errors a replica answers its clients with;
- `server`: the gRPC services over a node;
- `metrics`: the replica's Prometheus metrics.

`node` imports the others; none of them imports `node`.
"""
