"""Tools built on the runtime and the client: the `rlog` CLI, `rlog dev` (a local log of real
replica processes), `rlog bench`, and the consistency checker used by tests and e2e runs."""
