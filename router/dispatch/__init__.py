"""Dispatch: ``RouterCore`` (``core``), what the front calls: ``routing`` (decisions, batched
ones through ``collector``, recorded in the router state) and ``membership`` (the engines
routed to and the I/O around them: telemetry and KV-event subscriptions, health probes,
admin verdicts, the other router workers), over one ``router.state.cluster.ClusterState``."""
