"""Dispatch: ``RouterCore`` (``core``), the orchestrator the HTTP front calls. It owns the
I/O around the router state (telemetry and KV-event subscriptions, health probes), asks the
policy for decisions (batched ones through ``collector``) and records them in ``state``."""
