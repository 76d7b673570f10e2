"""Router state, plain data with no I/O: engine table, KV prefix index, in-flight ledger,
program table, counters, and the read-only views policies see. ``router.dispatch`` owns
and updates it."""
