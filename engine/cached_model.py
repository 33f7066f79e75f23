"""CachedModel: a causal LM plus its KV cache, fed chains or whole token trees.

Both the verifier and the model drafters use it. The cache holds the key/values of a prefix of
committed tokens; a tree forward appends the tree's nodes after that prefix, and `keep` then
retains only chosen sequence positions (the accepted path), in order, in every layer:

    keys[l] : [B, Hkv, S, D]  ->  keys[l][:, :, keep]  : [B, Hkv, len(keep), D]

done in place by kv_cache.py (preallocated buffers: no copy of the prefix per step).

Tree forward (SpecInfer's tree-based parallel decoding): one pass over all N nodes with
position_ids = prefix_len + depth and a 4-D boolean mask [1, 1, N, prefix_len + N] in which a
node sees the prefix and its ancestors only. It reproduces, to float tolerance, the logits each
node would get from a plain forward over its root-to-node chain.
"""

from __future__ import annotations

import inspect

import torch

from .kv_cache import keep_positions, new_cache
from .tree import TokenTree


def tree_pass(tree: TokenTree, cached: int, nodes: list[int] | None, device):
    """What a runner feeds for tree nodes `nodes` (default all) when its cache holds `cached`
    positions, the nodes before nodes[0] last among them: (tokens [T], positions [T], mask
    [1, 1, T, prefix + nodes[-1] + 1] bool), prefix = the committed tokens before the root."""
    nodes = list(range(len(tree))) if nodes is None else nodes
    prefix_len = cached - nodes[0]  # committed prefix; tree nodes [0, nodes[0]) follow it
    positions = tree.position_ids(prefix_len, device)[nodes]  # [T]
    full = tree.attention_mask(prefix_len, device)  # [1, 1, N, prefix + N]
    mask = full[:, :, nodes, : prefix_len + nodes[-1] + 1]  # [1, 1, T, prefix + first + T]
    return [tree.tokens[i] for i in nodes], positions, mask


class CachedModel:
    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = new_cache(model.config)
        # transformers renamed forward's `past_key_values` to `cache` (5.2x; the old name warns)
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = new_cache(self.model.config)

    @torch.inference_mode()
    def forward_chain(self, tokens: list[int], last_only: bool = False) -> torch.Tensor:
        """Append a causal chain of tokens to the cache; logits [T, V] in fp32 ([1, V] if last_only)."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, T]
        start = self.length
        positions = torch.arange(start, start + len(tokens), device=self.device)[None]  # [1, T]
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            **{self.cache_arg: self.cache},
        )
        return out.logits[0].float()

    @torch.inference_mode()
    def forward_tree(self, tree: TokenTree, nodes: list[int] | None = None) -> torch.Tensor:
        """Append tree nodes (default all, in order) to the cache in ONE pass; logits [len(nodes), V].

        With `nodes` a suffix of the tree (nodes[0] > 0), earlier nodes must already sit in the
        cache right after the committed prefix, in tree order (how drafters grow trees by depth).
        """
        tokens, positions, mask = tree_pass(tree, self.length, nodes, self.device)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, T]
        out = self.model(
            input_ids=ids, position_ids=positions[None], attention_mask=mask, use_cache=True, **{self.cache_arg: self.cache}
        )
        return out.logits[0].float()

    @torch.inference_mode()
    def keep(self, positions: list[int]) -> None:
        """Keep only these sequence positions of the cache, in this order (all layers)."""
        keep_positions(self.cache, positions, self.device)

    def rewind(self, cached_ids: list[int], prompt_ids: list[int]) -> int:
        """Keep the cache's prefix that `cached_ids` (the tokens it holds) shares with `prompt_ids`,
        at most all but the prompt's last token (whose logits a prefill must compute); [] or
        nothing shared resets it. Returns the kept length."""
        shared = 0
        for a, b in zip(cached_ids, prompt_ids):
            if a != b:
                break
            shared += 1
        kept = min(shared, len(prompt_ids) - 1, self.length)
        if kept > 0:
            self.crop(kept)
        else:
            self.reset()
        return max(kept, 0)

    def crop(self, length: int) -> None:
        """Drop everything after the first `length` positions."""
        if self.length > length:
            self.keep(list(range(length)))
