"""The router's predictors measured: ``profile`` (an engine's step times and telemetry: the
TPOT heads' data and the twin's step times), ``latency`` (a trained predictor's latency,
alone and batched). The replay's trained artifacts are the lab's (``lab.replay.artifacts``)."""
