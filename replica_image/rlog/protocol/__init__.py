"""The pure protocol: rules as functions of state and message, no I/O, no clocks.

- `replica`: the acceptor/learner (`ReplicaCore`), each rule returning its reply and what
  must be durable before the reply leaves;
- `records`: the records those rules take and hold (actions and runs: their spans, their
  checks, the pending ones layered over the stored);
- `consensus`: one Paxos round over a range of positions (promise tally, fill);
- `coordinator`: the proposer as a state machine that talks only through typed outputs;
- `recover`: the recover round that decides how an EMPTY or RECOVERING replica rejoins;
- `election`: when a replica stands for election (timer, pre-vote), whom it follows, and
  when it refuses rivals or steps down.
"""
