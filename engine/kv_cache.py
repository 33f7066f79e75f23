"""A KV cache that grows in place: preallocated buffers, appends by copy, compaction in place.

transformers' DynamicLayer appends with torch.cat (a copy of the whole layer cache every
forward) and the engine compacted the accepted path with index_select (another whole copy every
step): both O(prefix) per step, a sixth of a one-token step at a 200-token prefix. GrowingLayer
keeps one buffer per layer with spare capacity (doubled when full):

    buffer      [B, H, capacity, D]
    keys/values buffer[:, :, :length, :]       views; what attention reads

    update      write the new states at [length, length + T), length += T
    crop        length = n (no copy)
    compact     keep positions p_0 < p_1 < ... (the accepted path after the prefix): only the moved
                tail is copied, buffer[:, :, j:] = buffer[:, :, p_j:] for the positions that differ

Other layer kinds (sliding windows, linear attention) stay as transformers makes them; the
engine compacts those with index_select.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256


class GrowingLayer(DynamicLayer):
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length = 0
        self.key_buffer = self.value_buffer = None

    def _reserve(self, needed: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        capacity = 0 if self.key_buffer is None else self.key_buffer.shape[-2]
        if needed <= capacity:
            return
        capacity = max(MIN_CAPACITY, 2 * capacity, needed)
        keys = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])  # [B, H, cap, D]
        values = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
        if self.length:
            keys[..., : self.length, :] = self.key_buffer[..., : self.length, :]
            values[..., : self.length, :] = self.value_buffer[..., : self.length, :]
        self.key_buffer, self.value_buffer = keys, values

    def _views(self) -> None:
        self.keys = self.key_buffer[..., : self.length, :]
        self.values = self.value_buffer[..., : self.length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        self._reserve(self.length + new, key_states, value_states)
        self.key_buffer[..., self.length : self.length + new, :] = key_states
        self.value_buffer[..., self.length : self.length + new, :] = value_states
        self.length += new
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        if self.is_initialized and tokens_to_remove:
            self.length = max(self.length + tokens_to_remove, 0)
            self._views()

    def keep(self, positions: list[int]) -> None:
        """Keep these positions, in this order, assuming positions[j] >= j (a prefix, then a path)."""
        first = next((j for j, p in enumerate(positions) if p != j), len(positions))
        if first < len(positions):
            source = torch.tensor(positions[first:], dtype=torch.long, device=self.key_buffer.device)
            self.key_buffer[..., first : len(positions), :] = self.key_buffer.index_select(-2, source)
            self.value_buffer[..., first : len(positions), :] = self.value_buffer.index_select(-2, source)
        self.length = len(positions)
        self._views()

    def reset(self) -> None:
        super().reset()
        self.length = 0
        self.key_buffer = self.value_buffer = None


def new_cache(config) -> DynamicCache:
    """A DynamicCache whose full-attention layers grow in place."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def keep_positions(cache: DynamicCache, positions: list[int], device) -> None:
    """Keep only these sequence positions of every layer, in this order."""
    index = None
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            continue
        if isinstance(layer, GrowingLayer):
            layer.keep(positions)
            continue
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        if index is None:
            index = torch.tensor(positions, dtype=torch.long, device=device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)
