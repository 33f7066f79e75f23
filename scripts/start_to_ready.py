#!/usr/bin/env python
# Usage: .venv/bin/python scripts/start_to_ready.py [--rounds 3] [--model smollm2-135m]
"""Start to ready of the app's engine (docs/performance.md), models and cost model cached.

Each measurement is a fresh Python process, timed from its start:
  worker   what `spectui chat` does before its first answer: prepare_engine_process(), then
           EngineWorker(LoadRequest) until Loaded (the user's model cache and cost cache); then
           the worker started a second time in that process (ready again after a restart)
  app      ChatApp headless (Textual's run_test) until its engine is ready
in each configuration, interleaved round by round:
  forkserver   the engine process forks from the fork server (today's default)
  spawn        a spawned engine process (the start method before)
each with the model cache's quantized copy of the verifier, and without it (removed before every
start, so the verifier is quantized at load as before; the user's copy is put back at the end).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import asyncio, json, multiprocessing, shutil, sys, time
began = time.monotonic()
from spectui import paths
from spectui.engine import worker
from spectui.engine.quantization import FOLDER
from spectui.engine.settings import RunSpec
from spectui.engine.worker import EngineWorker, LoadRequest, prepare_engine_process


def fresh():  # "without": no quantized copy for the next start (a start writes one)
    if sys.argv[3] == "without":
        shutil.rmtree(paths.models_dir() / FOLDER, ignore_errors=True)


async def app_ready():
    from spectui.chat_app import ChatApp

    app = ChatApp()
    async with app.run_test() as pilot:
        while app.engine is None and not app.load_error:
            await pilot.pause(0.02)
        assert app.load_error is None, app.load_error
        return time.monotonic() - began


if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        worker.engine_context = lambda: multiprocessing.get_context("spawn")
    fresh()
    if sys.argv[4] == "app":
        print(json.dumps({"first": asyncio.run(app_ready())}))
        sys.exit()
    prepare_engine_process()
    times, t = [], began
    for _ in range(2):
        w = EngineWorker(LoadRequest(RunSpec(sys.argv[2]), models_dir=str(paths.models_dir()), cost_cache=str(paths.costs_dir())))
        w.wait_loaded()
        times.append(time.monotonic() - t)
        w.close()
        fresh()
        t = time.monotonic()
    print(json.dumps({"first": times[0], "restart": times[1]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    from spectui import paths
    from spectui.engine.quantization import FOLDER

    quantized = paths.models_dir() / FOLDER
    aside = Path(tempfile.mkdtemp(prefix="quantized-aside-"))
    script = aside / "child.py"
    script.write_text(CHILD)
    kept = quantized.exists()
    if kept:
        shutil.copytree(quantized, aside / FOLDER)
    results: dict[str, list[dict]] = {}
    try:
        for _ in range(args.rounds):
            for what in ("worker", "app"):
                for method in ("forkserver", "spawn"):
                    for copy in ("with", "without"):
                        if copy == "with" and kept and not quantized.exists():
                            shutil.copytree(aside / FOLDER, quantized)  # a "without" run removed it
                        out = subprocess.run([sys.executable, str(script), method, args.model, copy, what],
                                             capture_output=True, text=True, check=True).stdout
                        name = f"{what}: {method}, {copy} the quantized copy"
                        results.setdefault(name, []).append(json.loads(out.splitlines()[-1]))
                        print(name, results[name][-1], flush=True)
    finally:
        if kept:
            shutil.rmtree(quantized, ignore_errors=True)
            shutil.copytree(aside / FOLDER, quantized)
        shutil.rmtree(aside, ignore_errors=True)
    print("\n| start | ready (first start), s | ready again (restart), s |\n|---|---:|---:|")
    for name, runs in results.items():
        first = sorted(r["first"] for r in runs)
        again = sorted(r["restart"] for r in runs if "restart" in r)
        restart = f"{again[0]:.2f}-{again[-1]:.2f}" if again else "-"
        print(f"| {name} | {first[0]:.2f}-{first[-1]:.2f} | {restart} |")


if __name__ == "__main__":
    main()
