#!/usr/bin/env python
# Usage: .venv/bin/python scripts/start_to_ready.py [--rounds 3] [--model smollm2-135m]
"""Start to ready of the app's engine process, as the chat app starts it (docs/performance.md).

Each measurement is a fresh Python process that does what `spectui chat` does before its first
answer: prepare_engine_process(), then EngineWorker(LoadRequest) until Loaded, on the user's model
cache and cost cache (models and cost model cached). Ready again after a restart is the same worker
started a second time in that process. Configurations, interleaved round by round:

  forkserver   the engine process forks from the fork server (today's default)
  spawn        a spawned engine process (the start method before)
each with the model cache's quantized copy of the verifier present, and without it (moved aside
for that run, so the verifier is quantized at load as before).
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
import json, multiprocessing, sys, time
from spectui import paths
from spectui.engine import worker
from spectui.engine.worker import EngineWorker, LoadRequest, prepare_engine_process
if __name__ == "__main__":
    began = time.monotonic()
    if sys.argv[1] == "spawn":
        worker.engine_context = lambda: multiprocessing.get_context("spawn")
    prepare_engine_process()
    times, t = [], began  # the first from before the fork server starts, as in the app
    for _ in range(2):
        w = EngineWorker(LoadRequest(sys.argv[2], models_dir=str(paths.models_dir()), cost_cache=str(paths.costs_dir())))
        w.wait_loaded()
        times.append(time.monotonic() - t)
        w.close()
        t = time.monotonic()
    print(json.dumps({"first": times[0], "restart": times[1]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    from spectui import paths
    from spectui.engine.quantized_cache import FOLDER

    quantized = paths.models_dir() / FOLDER
    aside = Path(tempfile.mkdtemp(prefix="quantized-aside-"))
    script = aside / "child.py"
    script.write_text(CHILD)
    results: dict[str, list[dict]] = {}
    try:
        for _ in range(args.rounds):
            for method in ("forkserver", "spawn"):
                for copy in (True, False):
                    moved = not copy and quantized.exists()
                    if moved:
                        shutil.move(str(quantized), str(aside / FOLDER))
                    try:
                        out = subprocess.run([sys.executable, str(script), method, args.model], capture_output=True,
                                             text=True, check=True).stdout
                    finally:
                        if moved:
                            shutil.rmtree(quantized, ignore_errors=True)  # what this run wrote
                            shutil.move(str(aside / FOLDER), str(quantized))
                    name = f"{method}, {'with' if copy else 'without'} the quantized copy"
                    results.setdefault(name, []).append(json.loads(out.splitlines()[-1]))
                    print(name, results[name][-1], flush=True)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    print("\n| engine process | ready (first start), s | ready again (restart), s |\n|---|---:|---:|")
    for name, runs in results.items():
        first = sorted(r["first"] for r in runs)
        again = sorted(r["restart"] for r in runs)
        print(f"| {name} | {first[0]:.2f}-{first[-1]:.2f} | {again[0]:.2f}-{again[-1]:.2f} |")


if __name__ == "__main__":
    main()
