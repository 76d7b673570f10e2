"""What the serving path's own parts cost: ``scheduler`` (one ``schedule()`` call),
``telemetry`` (the snapshot stream and its step overhead), ``router`` (a routing decision)."""
