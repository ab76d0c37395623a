"""rlog: a Paxos replicated log in the design of the Mesos replicated log."""

__version__ = "0.1.0"
