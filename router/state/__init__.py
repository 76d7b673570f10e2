"""Router state: engine table, KV prefix index, in-flight ledger, program table, and the
``RouterCore`` facade (``router.state.core``)."""
