#!/usr/bin/env bash
# Grow the sampled traces (docs/research/traces.md, "Sampled traces") in slices of problems, so that
# a build stopped at any point leaves both Qwen models sampled on the same problems: for
# each N of $SLICES, math then code, `trace build --problems N` with both models (the
# builder runs the first N problems, one engine after the other, and skips every unit the
# file has). Resumable: rerun it after a kill (a kill loses only the runs in flight).
#
#   nohup nice -n 19 scripts/build_sampled_slices.sh >> build.log 2>&1 &
#
# Environment: PYTHON (default python), TRACE_DIR (where <suite>-sampled.jsonl.gz live,
# default data/traces; a missing file starts as a copy of data/traces/<suite>.jsonl.gz),
# SAMPLES (K, default 2), SLICES (default "5 10 20 35 50 75 100": every slice starts
# each engine once more, minutes on a busy machine, so the later slices grow),
# SUITES (default "math code").
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
TRACE_DIR=${TRACE_DIR:-data/traces}
SAMPLES=${SAMPLES:-2}
SLICES=${SLICES:-"5 10 20 35 50 75 100"}
SUITES=${SUITES:-"math code"}
MODELS=(qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct)

mkdir -p "$TRACE_DIR"
for suite in $SUITES; do
    out="$TRACE_DIR/$suite-sampled.jsonl.gz"
    [ -e "$out" ] || cp "data/traces/$suite.jsonl.gz" "$out"
done
for n in $SLICES; do
    for suite in $SUITES; do
        echo "[slices] $(date -u +%FT%TZ) $suite --problems $n" >&2
        "$PYTHON" -m kernels_bench trace build --cluster data/traces/qwen-cpu.toml \
            --suite "$suite" --problems "$n" --samples "$SAMPLES" \
            --temperature 0.7 --top-p 1.0 --models "${MODELS[@]}" \
            --out "$TRACE_DIR/$suite-sampled.jsonl.gz"
    done
done
echo "[slices] $(date -u +%FT%TZ) done" >&2
