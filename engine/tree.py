"""TokenTree: the speculated token tree as flat arrays (SpecInfer §3, "token tree").

Node 0 is the root: the newest committed token, whose key/values are not yet in any cache.
Every other node is a speculated token whose parent index is smaller than its own, so the
arrays are in topological order. Children of one parent carry distinct tokens: adding a token
that already hangs under a parent merges into that node and ORs in the source bit — that is how
the trees of several speculators merge into one (shared prefixes merged, sources kept).

Derived views:
- ancestor mask  M[i, j] = True iff j == i or j is an ancestor of i          [N, N]
- position ids   pos[i] = prefix_len + depth[i]                                [N]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TokenTree:
    tokens: list[int] = field(default_factory=list)  # [N] token ids
    parents: list[int] = field(default_factory=list)  # [N] parent index, -1 for the root
    depths: list[int] = field(default_factory=list)  # [N] 0 for the root
    sources: list[int] = field(default_factory=list)  # [N] bitmask of proposing speculators
    draft_probs: list[float] = field(default_factory=list)  # [N] max draft prob over sources
    verifier_probs: list[float | None] = field(default_factory=list)  # [N] filled by verification
    evidence: list[dict[int, int]] = field(default_factory=list)  # [N] source -> confidence bin (acceptance_model.py)
    contested: list[bool] = field(default_factory=list)  # [N] a sibling came from a rival proposal (mark_contested)

    @classmethod
    def with_root(cls, token: int) -> "TokenTree":
        tree = cls()
        tree._append(token, -1, 0, 0, 1.0)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def _append(self, token: int, parent: int, depth: int, source_mask: int, prob: float, evidence=None) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(depth)
        self.sources.append(source_mask)
        self.draft_probs.append(float(prob))
        self.verifier_probs.append(None)
        self.evidence.append(dict(evidence or {}))
        self.contested.append(False)
        return len(self.tokens) - 1

    @property
    def is_chain(self) -> bool:
        """Every node's parent is the node before it: the tree is one causal chain, so positions
        are prefix_len + i and the ancestor mask is lower-triangular (a plain causal pass)."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def child_with_token(self, node: int, token: int) -> int | None:
        for i, p in enumerate(self.parents):
            if p == node and self.tokens[i] == token:
                return i
        return None

    def add(self, parent: int, token: int, source: int, prob: float, conf_bin: int | None = None) -> int:
        """Hang `token` under `parent` for speculator number `source`; merge with an equal sibling.

        `conf_bin` is the speculator's confidence bin for this node (acceptance_model.py), if any.
        """
        bit = 1 << source
        existing = self.child_with_token(parent, token)
        if existing is not None:
            self.sources[existing] |= bit
            self.draft_probs[existing] = max(self.draft_probs[existing], float(prob))
            if conf_bin is not None:
                self.evidence[existing][source] = max(conf_bin, self.evidence[existing].get(source, conf_bin))
            return existing
        return self._append(token, parent, self.depths[parent] + 1, bit, prob, None if conf_bin is None else {source: conf_bin})

    def add_path(self, tokens: list[int], source: int, probs: list[float] | None = None, conf_bin: int | None = None) -> list[int]:
        """Add a chain of tokens below the root; returns the node ids along it."""
        node, ids = 0, []
        for k, token in enumerate(tokens):
            node = self.add(node, token, source, probs[k] if probs else 1.0, conf_bin)
            ids.append(node)
        return ids

    def merge(self, other: "TokenTree") -> None:
        """Union `other` (same root token) into this tree, keeping its source bits."""
        if other.tokens[0] != self.tokens[0]:
            raise ValueError("cannot merge trees with different roots")
        mapping = {0: 0}
        for i in range(1, len(other)):
            parent = mapping[other.parents[i]]
            existing = self.child_with_token(parent, other.tokens[i])
            if existing is None:
                mapping[i] = self._append(other.tokens[i], parent, self.depths[parent] + 1, other.sources[i],
                                          other.draft_probs[i], other.evidence[i])
            else:
                self.sources[existing] |= other.sources[i]
                self.draft_probs[existing] = max(self.draft_probs[existing], other.draft_probs[i])
                self.evidence[existing].update(other.evidence[i])
                mapping[i] = existing

    def select(self, keep: list[bool]) -> "TokenTree":
        """A new compact tree of the kept nodes (each kept node's parent must be kept), order preserved."""
        out = TokenTree()
        new_id: dict[int, int] = {-1: -1}
        for i in range(len(self)):  # parents come before children
            if keep[i]:
                new_id[i] = len(out.tokens)
                out.tokens.append(self.tokens[i])
                out.parents.append(new_id[self.parents[i]])
                out.depths.append(self.depths[i])
                out.sources.append(self.sources[i])
                out.draft_probs.append(self.draft_probs[i])
                out.verifier_probs.append(self.verifier_probs[i])
                out.evidence.append(dict(self.evidence[i]))
                out.contested.append(self.contested[i])
        return out

    def mark_contested(self, rivals: int = 0) -> list[bool]:
        """contested[i] = a sibling of node i was proposed by a speculator that did not propose i, or by
        one in the bitmask `rivals` that proposed i too (where proposals disagree, at most one is right:
        acceptance_model.py keys such nodes apart). A model's own top-k siblings do not contest each
        other (their probabilities already say how sure it is); the n-gram drafter's do, being rival
        matches whose confidence, the match length, does not say that another match disagrees. Kept
        by select, so the verified tree carries the flags of the tree it was chosen from."""
        offered = [0] * len(self)  # [N] sources of each node's children, together
        twice = [0] * len(self)  # [N] sources that proposed two or more of each node's children
        for i in range(1, len(self)):
            parent = self.parents[i]
            twice[parent] |= offered[parent] & self.sources[i]
            offered[parent] |= self.sources[i]
        self.contested = [False] * len(self)
        for i in range(1, len(self)):
            parent, own = self.parents[i], self.sources[i]
            self.contested[i] = bool(offered[parent] & ~own or twice[parent] & own & rivals)
        return self.contested

    def path_to(self, node: int) -> list[int]:
        """Node ids from the root's first child down to `node` (root excluded)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self, device=None) -> torch.Tensor:
        """[N, N] bool, M[i, j] = j is i or an ancestor of i (parents precede children)."""
        n = len(self)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            mask[i, i] = True
            parent = self.parents[i]
            if parent >= 0:
                mask[i] |= mask[parent]
        return mask.to(device) if device is not None else mask

    def position_ids(self, prefix_len: int, device=None) -> torch.Tensor:
        """[N] positions: prefix length + depth."""
        return torch.tensor(self.depths, dtype=torch.long, device=device) + prefix_len

    def attention_mask(self, prefix_len: int, device=None) -> torch.Tensor:
        """[1, 1, N, prefix_len + N] bool: every node sees the whole prefix and its own ancestors."""
        n = len(self)
        mask = torch.ones(n, prefix_len + n, dtype=torch.bool)
        mask[:, prefix_len:] = self.ancestor_mask()
        mask = mask[None, None]
        return mask.to(device) if device is not None else mask
