"""What the engine needs of a model on the GPU (models/transformer.py implements it). The engine
drives it and imports neither the GPU runtime nor the kernels."""
from __future__ import annotations

from typing import Protocol

import numpy as np


class Runner(Protocol):
    ctx: int                 # positions the KV cache holds
    batch: int               # tokens a prefill chunk takes
    vocab_size: int
    context_length: int      # the model's own maximum

    def set_sampling(self, temperature: float, top_k: int, top_p: float, seed: int) -> None:
        """The GPU sampler's settings for the tokens sampled from now on."""

    def prefill(self, ids: list[int], pos0: int, sample: bool) -> int:
        """Feed ids at positions pos0..; sample the next token (at pos0 + len) where asked. Returns submits."""

    def read_tokens(self, pos: int, n: int) -> list[int]:
        """Token ids at positions pos.. (waits for the GPU)."""

    def prepare_decode(self, max_tokens: int, slots: int) -> None:
        """Room for `slots` decode batches of up to `max_tokens` tokens in flight."""

    def record_decode(self, pos: int, k: int) -> object:
        """A batch that feeds the token at `pos` and samples k more (recorded, not yet submitted)."""

    def submit_decode(self, batch: object) -> None: ...

    def decoded_tokens(self, batch: object) -> list[int]:
        """A submitted batch's k token ids, once the GPU has written them."""

    def logits(self, ids: list[int]) -> np.ndarray:
        """(len(ids), vocab) logits of a fresh sequence from position 0."""
