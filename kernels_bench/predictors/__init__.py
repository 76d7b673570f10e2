"""The router's predictors offline: ``artifacts`` (trained once and cached for the replay),
``profile`` (an engine's step times and telemetry, measured: the TPOT heads' data and the
twin's step times), ``latency`` (a trained predictor's latency, alone and batched)."""
