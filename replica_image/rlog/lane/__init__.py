"""The lane: rlog's second transport beside gRPC, length-prefixed protobuf frames on a plain
or TLS asyncio connection to a replica's lane port (docs/data-path.md, "The write lane",
"The client's append lane", "Fetch and catch-up"). One hello names what a connection
carries (`LaneHello.kind`):

- `framed`: the framing, the buffer frames are received into, and the calling side of any
  lane (`FramedCaller`);
- `server`: the replica's lane port, which welcomes or refuses each connection and serves
  it (a leader's writes, a client's appends, a peer's fetches);
- `write`: the leader's write lane to a follower (`WriteLane`);
- `append`: a client's appends at the replica (`AppendLaneHandler`);
- `client`: the client's append lane to a replica (`AppendLane`);
- `fetch`: a catching-up replica's fetch lane to a peer (`FetchLane`);
- `tls`: the lane's mutual TLS contexts and the caller's names for the roles.

Dependencies point down: the lane uses the runtime's rules and encodings it carries
(`runtime.appends`, `runtime.fetch`, `runtime.write_stream`, `runtime.tls`) and never the
node, the peers or the gRPC server, which open it; nothing here imports `rlog.client`,
whose clients open the append lane.
"""
