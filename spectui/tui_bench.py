"""App vs headless throughput: does drawing the chat slow the engine down?

The same prompts are answered (greedy, same max new tokens) headless and through the app, per
prompt and round back to back, the order alternating, so background load and warm-up fall on
both sides alike. Headless runs three ways, StepEvents simply consumed: the engine in this process
at torch's default thread count and at the app's engine thread count (every core unless --engine-threads),
and an engine process of its own exactly like the app's; the fastest total is the baseline. The app is `ChatApp` as `spectui chat`
runs it (headless Textual: everything is laid out and rendered, only the terminal write is
missing), its engine in its own process, turns sent through `ChatApp.send` exactly as a
typed message is. Throughput is the engine's own measure, committed tokens over generation
time, summed over prompts and rounds. The app should keep at least 95 % of headless tokens/s.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass

from .engine import Conversation, EngineWorker, GenerationSettings, LoadRequest, RunSpec, chat_turn, engine_threads, tree_text


@dataclass
class Throughput:
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def run_headless(models, engine, prompts: list[str], settings: GenerationSettings) -> Throughput:
    out = Throughput()
    for prompt in prompts:
        conversation = Conversation()
        conversation.add("user", prompt)
        last = None
        for last in chat_turn(engine, models, conversation, settings):
            pass
        out.tokens += last.total_tokens
        out.seconds += last.elapsed_s
    return out


def run_headless_threads(models, engine, prompt: str, settings: GenerationSettings, threads: int) -> Throughput:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return run_headless(models, engine, [prompt], settings)
    finally:
        torch.set_num_threads(saved)


async def run_session(models, engine, run: RunSpec, threads: int | None, prompts: list[str], rounds: int, progress=None):
    """One app session; per prompt and round, a headless answer and an app answer, order alternating.

    Headless answers run in a thread while the app sits idle (its history goes to a throwaway
    SPECTUI_HOME that shares the model cache); app answers go through `ChatApp.send`, exactly
    as a typed message does.
    """
    from . import paths

    saved, models_dir = os.environ.get("SPECTUI_HOME"), paths.models_dir()
    with tempfile.TemporaryDirectory(prefix="spectui-tui-bench-") as home:
        os.environ["SPECTUI_HOME"] = home
        if models_dir.exists():
            paths.models_dir().parent.mkdir(parents=True)
            paths.models_dir().symlink_to(models_dir.resolve(), target_is_directory=True)
        try:
            return await _session(models, engine, run, threads, prompts, rounds, progress)
        finally:
            if saved is None:
                os.environ.pop("SPECTUI_HOME", None)
            else:
                os.environ["SPECTUI_HOME"] = saved


async def _session(models, engine, run, threads, prompts, rounds, progress):
    import torch

    from . import paths
    from .chat_app import ChatApp
    from .widgets.token_tree import TokenTreeView

    settings = run.settings
    thread_counts = sorted({torch.get_num_threads(), engine_threads(threads)})
    # headless in an engine process of its own, exactly like the app's but with nobody drawing
    worker = EngineWorker(LoadRequest(run, cost_cache=str(paths.costs_dir()), models_dir=str(paths.models_dir()),
                                      threads=threads))
    await asyncio.to_thread(worker.wait_loaded)

    def run_worker(prompt: str) -> Throughput:
        conversation = Conversation()
        conversation.add("user", prompt)
        last = None
        for last in worker.chat(conversation, settings):
            pass
        return Throughput(last.total_tokens, last.elapsed_s)

    overrides = {"max_new_tokens": settings.max_new_tokens, "tree": tree_text(settings.tree_shape),
                 "temperature": 0.0, "speculate": settings.speculate}
    app = ChatApp(run.model, run.ssms, run.quant, run.device, overrides=overrides, engine_threads=threads)  # as `spectui chat` does
    labels = {n: f"in this process, {n} thread{'s' if n > 1 else ''}" for n in thread_counts}
    headless = {label: [Throughput() for _ in range(rounds)] for label in [*labels.values(), "engine process"]}
    in_app = [Throughput() for _ in range(rounds)]
    async with app.run_test(size=(140, 42)) as pilot:
        while app.engine is None:
            if app.load_error:
                raise RuntimeError(f"the app could not load the models: {app.load_error}")
            await asyncio.sleep(0.1)
        await pilot.pause(0.2)
        await app.send(prompts[0])  # warm-up of both engine processes
        while app.generating:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(run_worker, prompts[0])
        for r in range(rounds):
            for i, prompt in enumerate(prompts):
                for kind in (("headless", "app") if (r + i) % 2 == 0 else ("app", "headless")):
                    if kind == "headless":
                        runs = {label: (run_headless_threads, models, engine, prompt, settings, n) for n, label in labels.items()}
                        runs["engine process"] = (run_worker, prompt)
                        for label, (fn, *args) in runs.items():
                            done = await asyncio.to_thread(fn, *args)
                            headless[label][r].tokens += done.tokens
                            headless[label][r].seconds += done.seconds
                    else:
                        await app.action_new_conversation()
                        await app.send(prompt)
                        while app.generating:
                            await asyncio.sleep(0.05)
                        last = app.chat.query_one(TokenTreeView).events[-1]
                        in_app[r].tokens += last.total_tokens
                        in_app[r].seconds += last.elapsed_s
            if progress:
                figures = ", ".join(f"{label} {runs[r].tokens_per_s:.1f}" for label, runs in headless.items())
                progress(f"round {r + 1}/{rounds}: headless {figures} tokens/s; app {in_app[r].tokens_per_s:.1f} tokens/s")
    worker.close()
    return headless, in_app


def total(throughputs: list[Throughput]) -> Throughput:
    return Throughput(sum(t.tokens for t in throughputs), sum(t.seconds for t in throughputs))


def compare(models, engine, run: RunSpec, prompts: list[str], rounds: int = 2, progress=None,
            threads: int | None = None) -> dict:
    """`run`: what `models` were loaded from, and its settings (greedy); threads: the app's engine process's."""
    max_new_tokens = run.settings.max_new_tokens
    run_headless(models, engine, prompts[:1], GenerationSettings(max_new_tokens=8))  # warm-up
    headless, in_app = asyncio.run(run_session(models, engine, run, threads, prompts, rounds, progress))
    by_setup = {label: total(rounds_) for label, rounds_ in headless.items()}
    best = max(by_setup, key=lambda label: by_setup[label].tokens_per_s)
    h, a = by_setup[best].tokens_per_s, total(in_app).tokens_per_s
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "rounds": rounds,
        "headless_tokens_per_s_by_setup": {label: round(t.tokens_per_s, 2) for label, t in by_setup.items()},
        "headless_best": best,
        "headless_tokens_per_s_by_round": [round(t.tokens_per_s, 2) for t in headless[best]],
        "app_tokens_per_s_by_round": [round(t.tokens_per_s, 2) for t in in_app],
        "headless_tokens_per_s": round(h, 2),
        "app_tokens_per_s": round(a, 2),
        "app_over_headless": round(a / h, 3) if h else None,
    }
