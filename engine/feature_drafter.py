"""FeatureDrafter: a FeatureHead (feature_head.py) in the speculator slot of the token tree.

It drafts like an SSM (kind "model": AutoDrafting runs it level by level while it pays, fixed trees
take its top-k expansion), but reads the verifier's features, which the engine hands it after every
verifier pass (`take_features`: the final hidden states of the committed tokens).

Positions. With committed tokens x_0 .. x_n (x_n the newest: the root of the next tree), the
verifier has computed f_0 .. f_{n-1}. The head's slot for position p >= 1 holds the key/values of
its input (x_p, f_{p-1}); catching up feeds positions fed+1 .. n, and its output at n, f^_n, gives
the root's children. A drafted node u at depth d is fed as (token_u, f^_parent(u)) at position
n + d, attending to every committed slot and to its fed ancestors, and its output f^_u gives u's
children. finish() drops the drafted slots: the cache holds committed positions again.

A fresh cache takes only the last CATCH_UP_WINDOW committed positions: slot j then holds position
offset + j + 1 (offset = the positions never fed). RoPE makes the head's attention depend on
relative positions alone, so this is the head run over the prompt's tail. On long prompts it is
as good and far cheaper: teacher-forced top-1 over the verifier's greedy answers (64 tokens) to 8
summarization + 8 RAG prompts of spec_bench_dev.jsonl (449-862 prompt tokens), the whole prompt fed
33.1 %, its last 256 positions 33.4 %, 128 33.9 %, 64 33.6 %; the first catch-up 87 -> 16 ms at 128
(2-core AMD EPYC; the head was trained on answers of at most 160 tokens). Later catch-ups extend
the cache as before.

Its proposals are deterministic (top-k of q), so stochastic verification treats them as point
masses, like every drafter here (accept.py).
"""

from __future__ import annotations

import torch

from ..kernels.head_layer import max_rows
from .acceptance_model import prob_bin
from .drafters import hang_top
from .feature_head import FeatureHead
from .tree import TokenTree

MIN_CAPACITY = 256
CATCH_UP_WINDOW = 128  # committed positions a fresh cache is fed at most (the module docstring)


def window_offset(root: int) -> int:
    """Positions 1 .. offset a fresh cache never feeds when its root is at position `root`: it is fed
    positions offset + 1 .. root, at most CATCH_UP_WINDOW of them (tune-eval feeds the same)."""
    return max(0, root - CATCH_UP_WINDOW)


class FeatureDrafter:
    kind = "model"
    wants_features = True

    def __init__(self, name: str, head: FeatureHead) -> None:
        self.name = name
        self.head = head
        c = head.config
        self.dtype = head.fc.weight.dtype
        self.vocab: list[int] = head.vocab_ids.tolist()  # draft column j -> token id (the head's, as it is now)
        self.features = torch.zeros(MIN_CAPACITY, c.hidden, dtype=self.dtype)  # [capacity, H]: f_p at row p
        self.known = 0  # features known for positions 0 .. known-1
        self.tokens: list[int] = []  # committed tokens at positions 0 .. offset + fed
        # slot j: position offset + j + 1
        self.kv = torch.zeros(2, 1, c.kv_heads, MIN_CAPACITY, c.head_dim, dtype=self.dtype)
        self.offset = 0  # committed positions 1 .. offset never fed (a fresh cache's window starts after them)
        self.fed = 0  # committed slots (positions offset + 1 .. offset + fed)
        self.used = 0  # slots in use, drafted ones included
        self.fed_last = 0  # positions the last catch_up fed
        self.kernel_rows = max_rows(self.dtype)  # rows a call of the head's C layer takes at most

    # ----------------------------------------------------------------- state
    def reset(self) -> None:
        self.known = self.fed = self.used = self.offset = 0
        self.tokens = []

    def rewind(self, prompt_ids: list[int]) -> None:
        """Keep what a new turn's prompt shares with the tokens seen (a chat turn); [] resets."""
        shared = self._keep_slots(prompt_ids)
        self.known = min(self.known, shared)

    def _keep_slots(self, tokens: list[int]) -> int:
        """Keep the slots of the positions whose tokens `tokens` shares -> the shared prefix length."""
        seen = len(self.tokens)
        if seen <= len(tokens) and tokens[:seen] == self.tokens:  # a step's usual case: they extend those seen
            shared = seen
        else:
            shared = 0
            for a, b in zip(self.tokens, tokens):
                if a != b:
                    break
                shared += 1
        self._cut(shared - 1 - self.offset)
        return shared

    def _cut(self, slots: int) -> None:
        """Keep at most `slots` committed slots (a fresh cache when none is left)."""
        self.fed = self.used = max(0, min(self.fed, slots))
        if self.fed == 0:
            self.offset = 0
        self.tokens = self.tokens[: self.offset + self.fed + 1] if self.fed else []

    def take_features(self, first: int, rows: torch.Tensor) -> None:
        """The verifier's features for positions first .. first + k - 1 (rows [k, H])."""
        need = first + len(rows)
        if need > len(self.features):
            grown = torch.zeros(max(need, 2 * len(self.features)), self.features.shape[1], dtype=self.dtype)
            grown[: self.known] = self.features[: self.known]
            self.features = grown
        self.features[first:need] = rows.to(self.dtype)
        self.known = need
        self._cut(first - self.offset)  # position p's slot reads f_{p-1}: those past `first` go

    def _reserve(self, slots: int) -> None:
        if slots > self.kv.shape[3]:
            kv = torch.zeros(*self.kv.shape[:3], max(slots, 2 * self.kv.shape[3]), self.kv.shape[4], dtype=self.dtype)
            kv[:, :, :, : self.used] = self.kv[:, :, :, : self.used]
            self.kv = kv

    def _run(self, tokens: list[int], prev: torch.Tensor, positions: list[int], mask,
             before: list[int] | None) -> torch.Tensor:
        """Feed rows into slots used .. used + T - 1 -> f^ [T, H]. mask [1, 1, T, used + T] or None (causal);
        before: the token before each row's (a prev_token head's; None for others)."""
        T = len(tokens)
        self._reserve(self.used + T)
        layer = self.head.layer_kernel
        before = None if before is None else torch.tensor(before)
        if layer is not None and T <= self.kernel_rows:  # a level, a catch-up (head_layer.max_rows): one C call
            rows = self.head.prev_inputs(prev, before)  # [T, H], or [T, 2H] with e(x_{t-1})
            out = layer(tokens, rows, positions, self.kv[:, 0], self.used, None if mask is None else mask[0, 0])
            self.used += T
            return out.to(self.dtype)  # [T, H]
        past = (self.kv[0, :, :, : self.used], self.kv[1, :, :, : self.used])
        out, (k, v) = self.head(torch.tensor([tokens]), prev[None], torch.tensor([positions]), past, mask,
                                None if before is None else before[None])
        self.kv[0, :, :, self.used : self.used + T] = k[:, :, -T:]
        self.kv[1, :, :, self.used : self.used + T] = v[:, :, -T:]
        self.used += T
        return out[0]  # [T, H]

    def _prev(self, position: int) -> torch.Tensor:
        """f_{position - 1} (zeros where the verifier has not given it: only when costs are measured)."""
        p = position - 1
        return self.features[p] if p < self.known else torch.zeros_like(self.features[0])

    @torch.inference_mode()
    def catch_up(self, committed: list[int]) -> torch.Tensor:
        """Feed the committed positions the slots lack -> f^ of the newest one (the root) [H]."""
        n = len(committed) - 1
        self._keep_slots(committed)
        self._cut(n - 1 - self.offset)  # the root is always fed again: its output is needed
        if self.fed == 0:
            self.offset = window_offset(n)
        first = self.offset + self.fed + 1
        positions = list(range(first, n + 1))
        if n <= self.known:  # f_{first - 1} .. f_{n - 1}, all given
            prev = self.features[first - 1 : n]  # [T, H]
        else:
            prev = torch.stack([self._prev(p) for p in positions])  # [T, H]
        self.fed_last = len(positions)
        before = [committed[p - 1] for p in positions] if self.head.config.prev_token else None
        out = self._run([committed[p] for p in positions], prev, positions, None, before)
        self.fed = n - self.offset
        self.tokens = list(committed)
        return out[-1]

    # ------------------------------------------------------------ drafting
    def _hang(self, tree: TokenTree, source: int, parents: list[int], features: torch.Tensor, width: int) -> list[int]:
        return hang_top(tree, source, parents, self.head.draft_logits(features), width, self.vocab)  # [F, Vd]

    def begin(self, committed: list[int], tree: TokenTree, source: int, width: int) -> list[int]:
        root = self.catch_up(committed)  # [H]
        self.n = len(committed) - 1
        self.own_feature = {0: root}  # merged-tree id -> f^ of a fed node (the root's: f^_n)
        self.own_slot: dict[int, int] = {}  # merged-tree id -> slot of a fed drafted node
        return self._hang(tree, source, [0], root[None], width)

    @torch.inference_mode()
    def expand(self, tree: TokenTree, source: int, frontier: list[int], width: int) -> list[int]:
        """Feed merged-tree nodes `frontier` (their parents fed) in one pass; hang top-`width` children."""
        first, T = self.used, len(frontier)
        mask = torch.zeros(1, 1, T, first + T, dtype=torch.bool)
        mask[..., : self.fed] = True  # committed slots (positions offset + 1 .. n)
        for row, node in enumerate(frontier):
            self.own_slot[node] = first + row
            ancestor = node
            while ancestor > 0:
                mask[0, 0, row, self.own_slot[ancestor]] = True
                ancestor = tree.parents[ancestor]
        prev = torch.stack([self.own_feature[tree.parents[node]] for node in frontier])  # [T, H]
        positions = [self.n + tree.depths[node] for node in frontier]
        before = [tree.tokens[tree.parents[node]] for node in frontier] if self.head.config.prev_token else None
        out = self._run([tree.tokens[node] for node in frontier], prev, positions, mask, before)
        for row, node in enumerate(frontier):
            self.own_feature[node] = out[row]
        return self._hang(tree, source, frontier, out, width)

    def finish(self) -> None:
        self.used = self.fed

    @torch.inference_mode()
    def draft(self, committed: list[int], tree: TokenTree, source: int, shape: tuple[int, ...]) -> None:
        """A fixed expansion config (drafters.ModelDrafter.draft): shape[d] children per node at depth d."""
        own = TokenTree.with_root(committed[-1])
        frontier = self.begin(committed, own, 0, shape[0]) if shape else []
        for width in shape[1:]:
            frontier = self.expand(own, 0, frontier, width)
        self.finish()
        for i in range(1, len(own)):
            own.sources[i] = 1 << source
            own.evidence[i] = {source: prob_bin(own.draft_probs[i])}
        tree.merge(own)
