"""The screenshots of docs/teaching.md, from the recorded traces in tests/tui/data (no model needed).

Each shot replays a trace headless in the chat app's own screen, steps to the verifier step it
explains, saves Textual's SVG screenshot, rasterises it with rsvg-convert and reduces it to 32
colours with pngquant (Debian's librsvg2-bin and pngquant) into docs/img/, about 70 KB a shot.
Run it again after a visual change of step mode:

    .venv/bin/python scripts/teaching_screenshots.py            # every shot
    .venv/bin/python scripts/teaching_screenshots.py greedy     # the shots whose name has 'greedy'
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "tui" / "data"
OUT = ROOT / "docs" / "img"

# name: (trace, keys pressed after opening it, terminal size)
SHOTS = {
    "teach-greedy": ("france.jsonl", ["n"] * 3, (160, 48)),
    "teach-sampling-accept": ("sampling.jsonl", ["n"] * 11, (160, 48)),
    "teach-sampling-residual": ("sampling.jsonl", ["n"] * 10, (160, 48)),
    "teach-not-tested": ("sampling.jsonl", ["n"] * 7, (160, 48)),
    "teach-browse-80x24": ("sampling.jsonl", ["n"] * 10 + ["f7"], (80, 24)),
}


async def shoot(name: str, trace: str, keys: list[str], size: tuple[int, int], svg: Path) -> None:
    from spectui.replay import read_turns
    from spectui.replay_app import ReplayApp

    app = ReplayApp(read_turns(DATA / trace), replay_name=trace, autoplay=False)
    async with app.run_test(size=size) as pilot:
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.5)
        # xml:space: rsvg-convert drops a text span's leading blanks, which are cells of the screen
        svg.write_text(app.export_screenshot(title="spectui").replace("<svg ", '<svg xml:space="preserve" ', 1),
                       encoding="utf-8")


def main(only: list[str]) -> None:
    missing = [tool for tool in ("rsvg-convert", "pngquant") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"{' and '.join(missing)} not found: apt-get install librsvg2-bin pngquant")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as home:
        os.environ["SPECTUI_HOME"] = home  # no user config: the default theme and settings
        for name, (trace, keys, size) in SHOTS.items():
            if only and not any(word in name for word in only):
                continue
            svg = Path(home) / f"{name}.svg"
            asyncio.run(shoot(name, trace, keys, size, svg))
            png = OUT / f"{name}.png"
            full = Path(home) / f"{name}.png"
            subprocess.run(["rsvg-convert", "--zoom", "0.75", "-o", str(full), str(svg)], check=True)
            subprocess.run(["pngquant", "32", "--speed", "1", "--force", "--output", str(png), str(full)], check=True)
            print(f"{png.relative_to(ROOT)}  {png.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(sys.argv[1:])
