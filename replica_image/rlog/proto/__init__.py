"""The messages and services replicas and clients exchange (`rlog.proto`), and the stubs
generated from it (`make proto`)."""
