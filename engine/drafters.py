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

from ..kernels.dense_cpu import softmax_top, softmax_top_function
from .acceptance_model import match_bin, prob_bin
from .lean_model import runner_for
from .tree import TokenTree


class ModelDrafter:
    kind = "model"

    def __init__(self, name: str, model) -> None:
        self.name = name
        self.runner = runner_for(model, drafting=True)  # LeanModel for a LLaMA SSM on CPU, else CachedModel
        self.ids: list[int] = []  # the tokens whose key/values sit in the SSM cache
        self.ready: torch.Tensor | None = None  # logits [1, V] after ids[-1], from a prefetch (pipeline.py)
        self.prefetches = self.hits = 0  # prefetches run, and those whose guess the verifier confirmed
        self.fed_last = 0  # tokens the last catch_up fed

    @property
    def synced(self) -> int:
        return len(self.ids)

    def reset(self) -> None:
        self.runner.reset()
        self.ids = []
        self.ready = None

    def rewind(self, prompt_ids: list[int]) -> None:
        """Keep the SSM cache's prefix shared with `prompt_ids` (a new chat turn); [] resets."""
        self.ids = self.ids[: self.runner.rewind(self.ids, prompt_ids)]
        self.ready = None

    def catch_up(self, committed: list[int]) -> torch.Tensor:
        """Feed the committed tokens the SSM cache lacks; logits [1, V] at the newest one (the root).

        The cache keeps the prefix it shares with `committed` (after a prefetch that guessed wrong,
        the guessed tokens go); logits a prefetch left for exactly `committed` serve without a forward.
        """
        ready, self.ready = self.ready, None
        if self.runner.length != self.synced:
            self.reset()
        if ready is not None and self.ids == committed:
            self.hits += 1
            self.fed_last = 0
            return ready
        kept = self.runner.rewind(self.ids, committed)  # the shared prefix, all but committed's last token at most
        self.fed_last = len(committed) - kept
        root_logits = self.runner.forward_chain(committed[kept:], last_only=True)  # [1, V]
        self.ids = list(committed)
        return root_logits

    def prefetch(self, committed: list[int], path: list[int]) -> None:
        """Pipelined drafting (pipeline.py): feed `path` after `committed`, guess the verifier's bonus
        token as this SSM's argmax after it, feed that too, and keep the logits after it, so that
        catch_up(committed + path + [guess]) needs no forward."""
        self.prefetches += 1
        leaf = self.catch_up(list(committed) + list(path))  # [1, V]
        guess = int(leaf[-1].argmax())
        self.ready = self.runner.forward_chain([guess], last_only=True)  # [1, V]
        self.ids = list(committed) + list(path) + [guess]

    def draft(self, committed: list[int], tree: TokenTree, source: int, shape: tuple[int, ...]) -> None:
        """Add this SSM's top-k expansion below tree's root (= committed[-1])."""
        runner = self.runner
        root_logits = self.catch_up(committed)[-1]  # [V]
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

    # ------------------------------------------------------------- adaptive drafting (auto_tree.py)
    def begin(self, committed: list[int], tree: TokenTree, source: int, width: int) -> list[int]:
        """Catch the SSM cache up with `committed` and hang its top-`width` guesses under the root.

        Returns the merged-tree ids of the new candidates. The SSM's own fed nodes are kept in
        `self.own` (root first, then every node fed so far, in feeding order: its cache order).
        """
        root_logits = self.catch_up(committed)  # [1, V]
        self.own = TokenTree.with_root(committed[-1])
        self.own_of = {0: 0}  # merged-tree id -> own-tree id, for fed nodes
        return self._hang(tree, source, [0], root_logits, width)

    def expand(self, tree: TokenTree, source: int, frontier: list[int], width: int) -> list[int]:
        """Feed merged-tree nodes `frontier` (candidates whose parents were fed) through the SSM in
        one pass and hang each one's top-`width` children under it; returns the new candidates."""
        own_ids = []
        for node in frontier:
            own_parent = self.own_of[tree.parents[node]]
            own_id = self.own._append(tree.tokens[node], own_parent, self.own.depths[own_parent] + 1, 1, 1.0)
            self.own_of[node] = own_id
            own_ids.append(own_id)
        logits = self.runner.forward_tree(self.own, own_ids)  # [F, V]
        return self._hang(tree, source, frontier, logits, width)

    def finish(self) -> None:
        """Drop the drafted nodes from the SSM cache: it holds the committed tokens again."""
        self.runner.crop(self.synced)

    def _hang(self, tree: TokenTree, source: int, parents: list[int], logits: torch.Tensor, width: int) -> list[int]:
        return hang_top(tree, source, parents, logits, width)


def hang_top(tree: TokenTree, source: int, parents: list[int], logits: torch.Tensor, width: int,
             vocab: list[int] | None = None) -> list[int]:
    """Hang each parent's top-`width` tokens of softmax(logits[row]) ([F, V']) under parents[row], with
    their probability and confidence bin; `vocab[j]` is column j's token id (default: j itself).
    Returns the ids of the new candidates."""
    columns, probs = softmax_top(logits.float().contiguous(), width, softmax_top_function())  # [F, width] each
    added = []
    for parent, row_columns, row_probs in zip(parents, columns.tolist(), probs.tolist()):
        for column, prob in zip(row_columns, row_probs):
            token = column if vocab is None else vocab[column]
            added.append(tree.add(parent, token, source, prob, prob_bin(prob)))
    return added


MATCH_DEPTH = 12  # tokens a continuation of the adaptive tree's n-gram matches runs to at most


class NGramDrafter:
    """Prompt lookup: reuse spans of the conversation that followed the current suffix.

    A continuation stops before the first `boundary` token (the tokenizer's special tokens: the chat
    template's turn markers, end of text). An answer that repeats the end of the user's question would
    otherwise draft on through "?<|im_end|>\n<|im_start|>assistant\n...", a chain of 5-9 nodes the
    verifier never takes: one such step verified 13 nodes in 77 ms for one token."""

    kind = "ngram"

    # Defaults measured on the embedded verifier (8 dev prompts, CPU): for fixed trees (propose),
    # suffixes of 2-4 tokens, one chain of 5: single-token matches and second branches cost more
    # verify time than they win there. The adaptive tree (matches) takes single-token matches too:
    # each match length has its own acceptance cell (an uncontested one-token match's first token
    # was accepted 54 % of the time here), so the tree verifies one only where it pays: tokens a
    # step +0.4 to +2 % in five A/Bs on Vicuna and short Spec-Bench prompts, speed -0.1 to +4.3 %
    # (docs/performance.md, stop 55).
    def __init__(self, name: str = "ngram", max_ngram: int = 4, min_ngram: int = 2, depth: int = 5, branches: int = 1,
                 boundary: frozenset[int] = frozenset(), min_match: int = 1):
        self.name = name
        self.max_ngram, self.min_ngram, self.min_match = max_ngram, min_ngram, min_match
        self.depth, self.branches = depth, branches
        self.boundary = frozenset(boundary)

    def _until_boundary(self, follow: list[int]) -> list[int]:
        """`follow` up to its first boundary token (excluded)."""
        for i, token in enumerate(follow):
            if token in self.boundary:
                return follow[:i]
        return follow

    def reset(self) -> None:
        pass

    def rewind(self, prompt_ids: list[int]) -> None:
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
                follow = self._until_boundary(committed[start + n : start + n + self.depth])
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

    def matches(self, committed: list[int], depth: int = MATCH_DEPTH, branches: int = 2, longest: int = 8) -> list[tuple[list[int], int]]:
        """Adaptive drafting: up to `branches` distinct continuations (at most `depth` tokens) of
        earlier occurrences of the newest token, with the length of the suffix they share with
        the end of `committed` (at most `longest`; at least `min_match`); longest match first,
        then the most recent. The match length is the continuation's confidence."""
        n_total = len(committed)
        if n_total < 2:
            return []
        reversed_ids = committed[::-1]  # reversed_ids[k] = committed[n_total - 1 - k]
        found, k = [], 0
        for _ in range(256):  # the 256 most recent occurrences are plenty, and bound the time
            try:
                k = reversed_ids.index(committed[-1], k + 1)  # an earlier occurrence, most recent first
            except ValueError:
                break
            position = n_total - 1 - k
            length = 1
            while length < longest and position - length >= 0 and committed[position - length] == committed[n_total - 1 - length]:
                length += 1
            if length >= self.min_match:
                found.append((length, position))
        found.sort(key=lambda item: (-item[0], -item[1]))
        out: list[tuple[list[int], int]] = []
        for length, position in found:  # continuations cut only for the occurrences that can be taken
            follow = self._until_boundary(committed[position + 1 : position + 1 + depth])
            if follow and all(follow[0] != chain[0] for chain, _ in out):
                out.append((follow, length))
                if len(out) == branches:
                    break
        return out

    def draft_matches(self, committed: list[int], tree: TokenTree, source: int, max_depth: int | None = None) -> None:
        """Hang `matches` under the root, each chain at most max_depth tokens (None: as deep as `matches` goes)."""
        depth = MATCH_DEPTH if max_depth is None else min(MATCH_DEPTH, max_depth)
        for chain, length in self.matches(committed, depth):
            tree.add_path(chain, source, conf_bin=match_bin(length))
