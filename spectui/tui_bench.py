"""App vs headless throughput: does drawing the chat slow the engine down?

The same loaded models answer the same prompts (greedy, same max new tokens) twice per round:
once headless (the StepEvents are simply consumed) and once through the app (a headless
Textual app, rendering the conversation, tree and chart from the very same StepEvents; only
the terminal write is missing). Throughput is the engine's own measure, committed tokens over
generation time, summed over prompts and rounds; headless takes, per prompt, the faster of torch's
default thread count and the app's (one core left to the UI); each prompt is answered both ways back to back,
the order alternating, so background load and warm-up fall on both sides alike. The app should keep at least 95 % of headless tokens/s.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass

from .engine.chat import Conversation, chat
from .engine.settings import GenerationSettings


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
        for last in chat(engine, models, conversation, settings):
            pass
        out.tokens += last.total_tokens
        out.seconds += last.elapsed_s
    return out


def best_headless(models, engine, prompt: str, settings: GenerationSettings) -> Throughput:
    from .app import torch_threads_beside_ui

    default = run_headless(models, engine, [prompt], settings)
    with torch_threads_beside_ui():
        fewer = run_headless(models, engine, [prompt], settings)
    return max(default, fewer, key=lambda t: t.tokens_per_s)


async def run_session(models, engine, prompts: list[str], settings: GenerationSettings, rounds: int, progress=None):
    """One app session; per prompt and round, a headless answer and an app answer, order alternating.

    Headless answers run in a thread while the app sits idle (its history goes to a throwaway
    SPECTUI_HOME); app answers go through `SpecTuiApp.send`, exactly as a typed message does.
    """
    saved = os.environ.get("SPECTUI_HOME")
    with tempfile.TemporaryDirectory(prefix="spectui-tui-bench-") as home:
        os.environ["SPECTUI_HOME"] = home
        try:
            return await _session(models, engine, prompts, settings, rounds, progress)
        finally:
            if saved is None:
                os.environ.pop("SPECTUI_HOME", None)
            else:
                os.environ["SPECTUI_HOME"] = saved


async def _session(models, engine, prompts, settings, rounds, progress):
    from .app import SpecTuiApp
    from .messages import ModelsLoaded
    from .widgets.token_tree import TokenTreeView

    overrides = {"max_new_tokens": settings.max_new_tokens, "tree": ",".join(map(str, settings.tree_shape)),
                 "temperature": 0.0, "speculate": settings.speculate}
    app = SpecTuiApp(autoload=False, overrides=overrides)
    headless, in_app = [Throughput() for _ in range(rounds)], [Throughput() for _ in range(rounds)]
    async with app.run_test(size=(140, 42)) as pilot:
        app.post_message(ModelsLoaded(models, engine))
        await pilot.pause(0.2)
        for r in range(rounds):
            for i, prompt in enumerate(prompts):
                for kind in (("headless", "app") if (r + i) % 2 == 0 else ("app", "headless")):
                    if kind == "headless":
                        # the faster of the engine's default thread count and the app's (one core left to
                        # the UI), so the app is held to the best headless figure
                        done = await asyncio.to_thread(best_headless, models, engine, prompt, settings)
                        headless[r].tokens += done.tokens
                        headless[r].seconds += done.seconds
                    else:
                        await app.action_new_conversation()
                        await app.send(prompt)
                        while app.generating:
                            await asyncio.sleep(0.05)
                        last = app.chat.query_one(TokenTreeView).events[-1]
                        in_app[r].tokens += last.total_tokens
                        in_app[r].seconds += last.elapsed_s
            if progress:
                progress(f"round {r + 1}/{rounds}: headless {headless[r].tokens_per_s:.1f} tokens/s, "
                         f"app {in_app[r].tokens_per_s:.1f} tokens/s")
    return headless, in_app


def compare(models, engine, prompts: list[str], max_new_tokens: int, rounds: int = 2, progress=None) -> dict:
    settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=0.0)
    run_headless(models, engine, prompts[:1], GenerationSettings(max_new_tokens=8))  # warm-up
    headless, in_app = asyncio.run(run_session(models, engine, prompts, settings, rounds, progress))
    h = sum(t.tokens for t in headless) / sum(t.seconds for t in headless)
    a = sum(t.tokens for t in in_app) / sum(t.seconds for t in in_app)
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "rounds": rounds,
        "headless_tokens_per_s_by_round": [round(t.tokens_per_s, 2) for t in headless],
        "app_tokens_per_s_by_round": [round(t.tokens_per_s, 2) for t in in_app],
        "headless_tokens_per_s": round(h, 2),
        "app_tokens_per_s": round(a, 2),
        "app_over_headless": round(a / h, 3) if h else None,
    }
