"""Pipelined drafting (Minions, PEARL): the main SSM works on the next step while the verifier runs.

While the verifier scores step k's tree, a second thread runs the step's first model drafter over
the branch the verifier is most likely to accept and the SSM's own guess of the bonus token:

    guess    p = the tree's most probable root-to-leaf path (the highest draft probability at
             every level: the SSM's own greedy continuation where it drafted one)
    thread   feed p's tokens (one SSM forward) -> logits after p's leaf -> b = their argmax
             feed b (one forward) -> logits of step k+1's root, kept with the ids they follow
    step k+1 ModelDrafter.catch_up(committed): when committed == ids fed (the verifier accepted
             all of p and its bonus token was b), the kept logits serve and the catch-up forward
             is skipped; otherwise the SSM cache is cropped to the shared prefix and the rest is
             fed, which is what a step without pipelining does anyway.

The thread is joined before the step ends, so the SSM cache is never used from two threads at
once. Verification is untouched: the output is the same tokens (greedy) or the same distribution
(sampling), since drafts are a deterministic function of the committed tokens either way; only
where the SSM's work happens moves. On a CPU the thread shares the cores with the verifier: it runs
torch with one intra-op thread (torch's thread count is per thread), and the bench's
`speculative-pipelined` row says whether that pays on a machine (GenerationSettings.pipeline).
"""

from __future__ import annotations

import threading

import torch

from .tree import TokenTree


def likely_path(tree: TokenTree) -> list[int]:
    """Tokens of the root-to-leaf path taking the most probable draft child at every level."""
    children: dict[int, list[int]] = {}
    for i in range(1, len(tree)):
        children.setdefault(tree.parents[i], []).append(i)
    path, node = [], 0
    while node in children:
        node = max(children[node], key=lambda i: (tree.draft_probs[i], -i))
        path.append(tree.tokens[node])
    return path


class Prefetch:
    """One background prefetch: `drafter.prefetch(committed, path)` on a thread; `join` re-raises."""

    def __init__(self, drafter, committed: list[int], path: list[int]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(drafter, list(committed), path),
                                       name="spectui-prefetch", daemon=True)
        self.thread.start()

    def _run(self, drafter, committed: list[int], path: list[int]) -> None:
        torch.set_num_threads(1)  # this thread only: the verifier keeps its threads
        try:
            drafter.prefetch(committed, path)
        except BaseException as exc:  # surfaced by join() on the engine's thread
            self.error = exc

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def start_prefetch(tree: TokenTree, committed: list[int], drafters, ran: list[str]) -> Prefetch | None:
    """Prefetch for the first SSM named in `ran` (those that drafted this step), if the tree has a
    branch to follow. A feature drafter cannot: it needs the verifier's features of that branch."""
    models = [d for d in drafters if d.kind == "model" and d.name in ran and hasattr(d, "prefetch")]
    path = likely_path(tree)
    if not models or not path:
        return None
    return Prefetch(models[0], committed, path)
