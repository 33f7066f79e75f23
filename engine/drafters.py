"""Speculators: each one grows candidate branches under the root of the step's TokenTree.

- ModelDrafter: a small speculative model (SSM). It expands the tree by top-k per depth,
  following SpecInfer's expansion config: shape (2, 2, 1, 1) gives every node at depth d
  shape[d] children, so 2, 4, 4, 4 nodes at depths 1..4. One SSM forward per depth: the new
  frontier is fed as a tree over the SSM's own cache, which is then cropped back to the
  committed tokens.
- NGramDrafter: prompt lookup. The longest suffix of the committed tokens that occurred
  earlier proposes what followed it there, as chains (no model at all).

Both are deterministic given the committed tokens, so their proposals are point masses:
stochastic verification treats each proposed child as q = delta(token) (see accept.py).
"""

from __future__ import annotations

import torch

from .cached_model import CachedModel
from .tree import TokenTree


class ModelDrafter:
    kind = "model"

    def __init__(self, name: str, model) -> None:
        self.name = name
        self.runner = CachedModel(model)
        self.synced = 0  # committed tokens whose key/values sit in the SSM cache

    def reset(self) -> None:
        self.runner.reset()
        self.synced = 0

    def draft(self, committed: list[int], tree: TokenTree, source: int, shape: tuple[int, ...]) -> None:
        """Add this SSM's top-k expansion below tree's root (= committed[-1])."""
        runner = self.runner
        if self.synced > len(committed) or runner.length != self.synced:
            self.reset()
        root_logits = runner.forward_chain(committed[self.synced :], last_only=True)[-1]  # [V]
        self.synced = len(committed)
        own = TokenTree.with_root(committed[-1])
        frontier, logits = [0], root_logits[None]  # logits[i] belongs to frontier[i]
        for depth, width in enumerate(shape):
            probs = torch.softmax(logits, dim=-1)  # [F, V]
            top = torch.topk(probs, width, dim=-1)
            added = []
            for row, node in enumerate(frontier):
                for prob, token in zip(top.values[row].tolist(), top.indices[row].tolist()):
                    added.append(own.add(node, token, source, prob))
            if depth == len(shape) - 1:
                break
            frontier = added
            logits = runner.forward_tree(own, frontier)  # [F, V]; nodes fed by depth, in order
        runner.crop(self.synced)
        tree.merge(own)


class NGramDrafter:
    """Prompt lookup: reuse spans of the conversation that followed the current suffix."""

    kind = "ngram"

    # Defaults measured on the embedded verifier (8 dev prompts, CPU): suffixes of 2-4 tokens, one
    # chain of 5. Single-token matches and second branches cost more verify time than they win.
    def __init__(self, name: str = "ngram", max_ngram: int = 4, min_ngram: int = 2, depth: int = 5, branches: int = 1):
        self.name = name
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.depth, self.branches = depth, branches

    def reset(self) -> None:
        pass

    def propose(self, committed: list[int]) -> list[list[int]]:
        """Up to `branches` distinct continuations, from the longest matching suffix, most recent first."""
        n_total = len(committed)
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, n_total - 1), self.min_ngram - 1, -1):
            pattern = committed[n_total - n :]
            for start in range(n_total - n - 1, -1, -1):  # most recent occurrence first
                if committed[start : start + n] != pattern:
                    continue
                follow = committed[start + n : start + n + self.depth]
                if follow and follow not in found:
                    found.append(follow)
                    if len(found) == self.branches:
                        return found
            if found:
                return found
        return found

    def draft(self, committed: list[int], tree: TokenTree, source: int, shape: tuple[int, ...]) -> None:
        for chain in self.propose(committed):
            tree.add_path(chain, source)
