"""SpeculativeEngine: SpecInfer-style tree speculation as a generator of StepEvents.

One step (one verifier forward pass):

    draft_tree      a fixed expansion config: every speculator adds its branches below the root,
                    merged by settings.merge (union or vote; merge.py). `--tree auto`: the tree
                    with the best expected tokens per ms under the measured cost model and the
                    online acceptance model (auto_tree.py), possibly the root alone
    score_tree      the verifier scores all N nodes at once over its KV cache   logits [N, V]
    accept_branch   greedy or MSS picks the accepted branch and the bonus token
    commit_branch   the verifier cache keeps prefix + root + accepted nodes, in order
    yield StepEvent

Cache invariant: the verifier cache holds every committed token except the newest one, which
is the root of the next tree. The prefill computes the first token (step 0), so incremental
decoding (no speculators: the tree is the root alone) is the same loop, one token per step.

Honest speed-up (speedup.py): every step's engine time is measured (pauses of the consumer
excluded); speculative steps are compared with real one-token steps without drafting ("pure"
steps) timed in this process at a similar prefix. When none is recent enough, the engine takes a
pure step itself (a calibration step: lossless, it is an incremental step).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .acceptance_model import AcceptanceModel
from .accept import SamplingLog, accept_greedy, accept_stochastic, sample_token, target_probs
from .auto_tree import AutoDrafting
from .costs import CostModel
from .events import BONUS_SOURCE, StepEvent, TreeNode
from .lean_model import runner_for
from .merge import apply_policy
from .pipeline import start_prefetch
from .settings import GenerationSettings
from .speedup import PureSteps, SpeedupMeter
from .text import IncrementalDecoder
from .threads import ThreadGovernor
from .tree import TokenTree


@dataclass
class StepResult:
    tree: TokenTree
    accepted: list[int]
    bonus: int
    draft_ms: float
    verify_ms: float
    pure: bool = False  # a one-token step that drafted nothing: an incremental step
    ran: list[str] = field(default_factory=list)  # SSMs that drafted (auto)
    sampling: SamplingLog | None = None  # the sampling test's numbers (detail only)
    threads: int = 0  # the verifier pass's threads (threads.py)


@dataclass
class RunningStats:
    started: float = field(default_factory=time.perf_counter)
    steps: int = 0  # verifier steps after the prefill
    tokens: int = 0  # committed new tokens, the prefill's included
    step_tokens: int = 0  # committed by speculation steps
    drafted: int = 0
    accepted: int = 0
    meter: SpeedupMeter = field(default_factory=SpeedupMeter)
    engine_ms: float = 0.0  # the engine's own time: prefill and steps, the consumer's pauses excluded

    def fill(self, event: StepEvent) -> StepEvent:
        event.total_tokens = self.tokens
        event.acceptance_rate = self.accepted / self.drafted if self.drafted else 0.0
        event.mean_accepted = self.step_tokens / self.steps if self.steps else 0.0
        event.elapsed_s = time.perf_counter() - self.started
        return event

    def time(self, event: StepEvent, start: float) -> None:
        """The step's engine time (drafting to event) and the tokens/s of engine time so far."""
        event.step_ms = (time.perf_counter() - start) * 1000
        self.engine_ms += event.step_ms
        event.tokens_per_s = self.tokens / self.engine_ms * 1000 if self.engine_ms > 0 else 0.0


class SpeculativeEngine:
    def __init__(self, verifier, tokenizer, drafters=(), stop_token_ids=(), attention_backend: str = "torch"):
        self.verifier = runner_for(verifier)  # LeanModel on the exact CPU path, else CachedModel
        self.tokenizer = tokenizer
        self.drafters = list(drafters)
        self.stop_token_ids = set(stop_token_ids)
        self.attention_backend = attention_backend
        self.cost_model: CostModel | None = None  # set by calibrate.prepare_costs, or measured at first auto use
        self.acceptance_model = AcceptanceModel(kinds={d.name: d.kind for d in self.drafters})
        self.pure_steps = PureSteps()
        self.auto: AutoDrafting | None = None
        self.cached_ids: list[int] = []  # the tokens whose key/values the verifier cache holds after an answer
        self.prefilled = 0  # prompt tokens the last answer's prefill computed (the rest were reused)
        self.acceptance_file = None  # where the acceptance model is kept between processes (remember_acceptance)
        self.adaptive_threads = True  # fewer threads while other processes hold cores (threads.py)
        self.governor: ThreadGovernor | None = None
        self.thread_switches = 0  # changes of the verifier's thread count since the engine was made (none when quiet)

    @property
    def speculator_names(self) -> list[str]:
        return [d.name for d in self.drafters]

    def auto_drafting(self) -> AutoDrafting:
        if self.cost_model is None:
            from .calibrate import measure_costs

            self.cost_model = measure_costs(self)
        if self.auto is None or self.auto.costs is not self.cost_model:
            self.auto = AutoDrafting(self.cost_model, self.acceptance_model)
        return self.auto

    def generate(
        self, prompt_ids: list[int], settings: GenerationSettings, stop: threading.Event | None = None,
        reuse: bool = False,
    ) -> Iterator[StepEvent]:
        """Yield one StepEvent per verifier step until end of turn, max_new_tokens or `stop`.

        reuse: keep the key/values of the longest prefix this prompt shares with the previous
        answer's tokens (the conversation so far), so a chat turn prefills only what is new.
        The thread count may change while the answer runs (threads.py); it is the caller's again after.
        """
        self.govern_threads()
        try:
            yield from self.answer(prompt_ids, settings, stop, reuse)
        finally:
            if self.governor is not None:
                torch.set_num_threads(self.governor.most)

    def answer(self, prompt_ids: list[int], settings: GenerationSettings, stop: threading.Event | None,
               reuse: bool) -> Iterator[StepEvent]:
        """generate's steps, at the threads the governor sets."""
        generator = torch.Generator().manual_seed(settings.seed if settings.seed is not None else 0)
        if settings.seed is None:
            generator.seed()
        drafters = self.drafters if settings.speculate else []
        if drafters and settings.auto:
            self.auto_drafting().begin_answer()
        committed = list(prompt_ids)
        start = time.perf_counter()
        kept = self.verifier.rewind(self.cached_ids, committed if reuse else [])
        for drafter in drafters:
            drafter.rewind(committed if reuse else [])
        self.cached_ids = []  # until this answer finishes, the cache holds nothing reusable
        stats = RunningStats()
        decoder = IncrementalDecoder(self.tokenizer)

        self.prefilled = len(committed) - kept
        readers = [d for d in drafters if getattr(d, "wants_features", False)]  # feature drafters (feature_drafter.py)
        self.verifier.keep_hidden = bool(readers)
        self.verifier.argmax_only = settings.greedy and not settings.detail  # LeanModel: the bf16 screen
        threads = self.begin_pass()
        logits = self.verifier.forward_chain(committed[kept:], last_only=True)  # [1, V]
        self.end_pass()
        self.share_features(readers, kept, list(range(len(committed) - kept)))
        first = self.pick_token(logits, settings, generator)
        result = StepResult(TokenTree.with_root(committed[-1]), [], first, 0.0, (time.perf_counter() - start) * 1000,
                            threads=threads)
        step = 0
        while True:
            event, committed_now = self.build_event(step, result, committed, settings, stats, decoder)
            stats.time(event, start)
            if step > 0:
                self.measure_speedup(event, result, len(committed), stats)
            committed += committed_now
            if event.finished:  # a cut at end of turn or max_new_tokens: keep the invariant anyway
                self.verifier.crop(len(committed) - 1)
            if not event.finished and stop is not None and stop.is_set():
                event.finished, event.stop_reason = True, "stopped"
            if event.finished:
                self.cached_ids = committed[:-1]  # the cache invariant: all but the newest token
                self.save_acceptance()
            yield event
            if event.finished:
                return
            step += 1
            start = time.perf_counter()
            result = self.speculate_step(committed, drafters, settings, generator, settings.max_new_tokens - stats.tokens)
            self.share_features(readers, len(committed) - 1, [0, *result.accepted])

    def govern_threads(self) -> None:
        """Keep, or start, the thread governor (threads.py) for a verifier whose bits do not depend on the
        thread count. The caller's count is the most it uses (a new one starts a new governor); an answer
        resumes at the count the last one ended with, as the other processes may still be there."""
        configured = torch.get_num_threads()
        if not (self.adaptive_threads and getattr(self.verifier, "thread_invariant", False)):
            self.governor = None
        elif self.governor is None or self.governor.most != configured:
            self.governor = ThreadGovernor(configured)
        elif self.governor.threads != configured:
            torch.set_num_threads(self.governor.threads)

    def begin_pass(self) -> int:
        """Before a verifier pass -> the threads it runs with."""
        if self.governor is not None:
            self.governor.begin_pass()
        return torch.get_num_threads()

    def end_pass(self) -> None:
        if self.governor is not None:
            threads = self.governor.end_pass()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
                self.thread_switches += 1

    def at_most_threads(self, threads: int) -> bool:
        """True if a pass with `threads` ran with the count the cost model measured (the governor's most)."""
        return self.governor is None or threads == self.governor.most

    def share_features(self, readers, first: int, rows: list[int]) -> None:
        """Hand feature drafters the verifier's final hidden states of the committed tokens its last
        pass computed: rows of that pass (of the tree: root, then the accepted nodes) for positions
        first, first + 1, ..."""
        if readers:
            hidden = self.verifier.hidden[0]  # [T, H]
            taken = hidden[rows] if len(rows) < len(hidden) else hidden
            for drafter in readers:
                drafter.take_features(first, taken)

    def remember_acceptance(self, path) -> bool:
        """Start from the acceptance model saved at `path` (if any) and save it there after every answer."""
        self.acceptance_file = path
        return self.acceptance_model.load(path)

    def save_acceptance(self) -> None:
        if self.acceptance_file is not None and self.auto is not None:
            try:
                self.acceptance_model.save(self.acceptance_file)
            except OSError:
                pass  # an unwritable cache costs what was learned, nothing else

    def measure_speedup(self, event: StepEvent, result: StepResult, prefix_len: int, stats: RunningStats) -> None:
        """The answer's speed-up over incremental decoding so far, from timed steps (speedup.py)."""
        reference = self.pure_steps.reference_ms(prefix_len)
        stats.meter.add(len(event.new_tokens), event.step_ms, result.pure, reference)
        self.pure_steps.record(prefix_len, event.step_ms, result.pure)
        if self.auto is not None:
            self.auto.observe_rate(len(event.new_tokens), event.step_ms)
        event.incremental_ms = event.step_ms if result.pure else reference
        event.speedup = stats.meter.speedup

    def pick_token(self, logits: torch.Tensor, settings: GenerationSettings, generator) -> int:
        if settings.greedy:
            rows = self.argmax_rows(logits)
            return rows[-1] if rows is not None else int(logits[-1].argmax())
        return sample_token(target_probs(logits[-1:], settings.temperature, settings.top_p)[0], generator)

    def speculate_step(self, committed: list[int], drafters, settings, generator, limit: int | None = None) -> StepResult:
        """One step; limit: the tokens the answer may still take (max_new_tokens less those it has), so an
        auto tree drafts no deeper than limit - 1 (its accepted branch and the bonus token fill the answer)
        and a step that may add one token drafts nothing."""
        t0 = time.perf_counter()
        ran: list[str] = []
        pure = not drafters or self.pure_steps.needs_calibration(len(committed)) or (limit is not None and limit <= 1)
        if pure:
            tree = TokenTree.with_root(committed[-1])  # a one-token step that drafts nothing
        elif settings.auto:
            tree, ran, _ = self.auto.draft(committed, drafters, settings.merge, None if limit is None else limit - 1)
        else:
            tree = self.draft_tree(committed, drafters, settings)
        t1 = time.perf_counter()
        prefetch = None
        if settings.pipeline and len(tree) > 1:  # the SSM drafts ahead while the verifier runs (pipeline.py)
            prefetch = start_prefetch(tree, committed, drafters, ran if settings.auto else [d.name for d in drafters])
        try:
            threads = self.begin_pass()
            logits = self.score_tree(tree)  # [N, V]
            self.end_pass()
            log = SamplingLog() if settings.detail and not settings.greedy and len(tree) > 1 else None
            accepted, bonus = self.accept_branch(tree, logits, settings, generator, log)
            self.commit_branch(tree, accepted)
        finally:
            if prefetch is not None:
                prefetch.join()
        t2 = time.perf_counter()
        if self.cost_model is not None and self.at_most_threads(threads):  # costs are per thread count
            self.cost_model.observe_verify(len(tree), (t2 - t1) * 1000)
        if self.auto is not None and (len(tree) > 1 or ran):
            self.auto.observe(tree, accepted, self.speculator_names, ran, (t2 - t1) * 1000)
        return StepResult(tree, accepted, bonus, (t1 - t0) * 1000, (t2 - t1) * 1000, pure, ran, log, threads)

    def draft_tree(self, committed: list[int], drafters, settings) -> TokenTree:
        # Drafting every speculator into one tree is their union: TokenTree.add merges equal
        # siblings and ORs the source bits, so sources[i] says which speculators' trees hold node i.
        tree = TokenTree.with_root(committed[-1])
        for source, drafter in enumerate(drafters):
            drafter.draft(committed, tree, source, settings.tree_shape)
        return apply_policy(tree, settings.merge)

    def score_tree(self, tree: TokenTree) -> torch.Tensor:
        # The root alone (incremental decoding) or a chain of drafts is a causal pass: no tree mask
        # to build, and the attention's causal path. The same logits, bit for bit: the exact
        # attention's output depends only on the keys a row sees (kernels/exact_attention.py).
        if tree.is_chain:
            return self.verifier.forward_chain(tree.tokens)
        return self.verifier.forward_tree(tree)

    def argmax_rows(self, logits: torch.Tensor) -> list[int] | None:
        """Each row's argmax of the verifier's last logits [N, V] where its argmax screen gave them (LeanModel's
        `argmax_rows`), else None: the rows would be scanned, V columns each, for the token they already know."""
        rows = getattr(self.verifier, "argmax_rows", None)
        return rows if rows is not None and len(rows) == logits.shape[0] else None

    def accept_branch(self, tree: TokenTree, logits, settings, generator, log: SamplingLog | None = None) -> tuple[list[int], int]:
        probs = None
        if settings.greedy:
            accepted, bonus = accept_greedy(tree, logits, self.argmax_rows(logits))
            if settings.detail and len(tree) > 1:
                probs = torch.softmax(logits, dim=-1)  # for display only
        else:
            probs = target_probs(logits, settings.temperature, settings.top_p)
            accepted, bonus = accept_stochastic(tree, probs, generator, log)
        if settings.detail and probs is not None:
            for i in range(1, len(tree)):
                tree.verifier_probs[i] = float(probs[tree.parents[i], tree.tokens[i]])
        return accepted, bonus

    def commit_branch(self, tree: TokenTree, accepted: list[int]) -> None:
        prefix = self.verifier.length - len(tree)
        self.verifier.keep(list(range(prefix)) + [prefix + i for i in [0, *accepted]])

    def build_event(self, step, result: StepResult, committed, settings, stats: RunningStats, decoder):
        """Turn a step's outcome into a StepEvent; cut at end of turn or max_new_tokens."""
        tree = result.tree
        tokens = [tree.tokens[i] for i in result.accepted] + [result.bonus]
        origins = [self.origin(tree.sources[i]) for i in result.accepted] + [BONUS_SOURCE]
        budget = settings.max_new_tokens - stats.tokens
        stop_reason = None
        for k, token in enumerate(tokens[:budget]):
            if token in self.stop_token_ids:
                tokens, stop_reason = tokens[: k + 1], "eos"
                break
        if stop_reason is None and len(tokens) >= budget:
            tokens, stop_reason = tokens[:budget], "length"
        origins = origins[: len(tokens)]
        accepted_ids = result.accepted[: len(tokens)]
        bonus_used = len(tokens) == len(result.accepted) + 1

        if step > 0:
            stats.steps += 1
            stats.step_tokens += len(tokens)
            stats.drafted += len(tree) - 1
            stats.accepted += len(result.accepted)
        stats.tokens += len(tokens)
        text_tokens = [t for t in tokens if t not in self.stop_token_ids]
        event = StepEvent(
            step=step,
            tree=self.describe_tree(tree) if settings.detail and len(tree) > 1 else [],
            accepted=accepted_ids,
            bonus_token=result.bonus if bonus_used else None,
            bonus_text=self.token_text(result.bonus) if bonus_used else "",
            new_tokens=tokens,
            new_text=decoder.push(text_tokens, final=stop_reason is not None),
            token_origins=origins,
            drafted=max(len(tree) - 1, 0),
            accepted_count=len(result.accepted),
            draft_ms=result.draft_ms,
            verify_ms=result.verify_ms,
            attention_backend=self.attention_backend,
            threads=result.threads,
            finished=stop_reason is not None,
            stop_reason=stop_reason,
            sampling=result.sampling.describe(self.token_text) if result.sampling else None,
        )
        return stats.fill(event), tokens

    def source_names(self, source_mask: int) -> list[str]:
        return [d.name for k, d in enumerate(self.drafters) if source_mask >> k & 1]

    def origin(self, source_mask: int) -> str:
        return "+".join(self.source_names(source_mask)) or BONUS_SOURCE

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def describe_tree(self, tree: TokenTree) -> list[TreeNode]:
        return [
            TreeNode(
                id=i,
                parent=tree.parents[i],
                depth=tree.depths[i],
                token_id=tree.tokens[i],
                text=self.token_text(tree.tokens[i]),
                sources=self.source_names(tree.sources[i]),
                draft_prob=tree.draft_probs[i] if i else None,
                verifier_prob=tree.verifier_probs[i],
            )
            for i in range(len(tree))
        ]

