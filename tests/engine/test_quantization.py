"""The model cache's quantized copies (engine/quantization.py) on a tiny random LLaMA: the second
load reads the copy and gets the same tensors and logits, bit for bit; a damaged copy or a changed
source is quantized again; an unwritable cache only costs time; `spectui models` lists the copies
and removing a model removes its copies."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from spectui.engine.catalog import cache_entries, remove_cache_entry
from spectui.engine.loading import load_causal_lm
from spectui.engine.quantization import FOLDER, MARKER, copies_of


@pytest.fixture
def source(tiny_dirs, tmp_path):
    folder = tmp_path / "models" / "gguf" / "tiny-1-2"  # where a converted .gguf would be
    shutil.copytree(tiny_dirs["verifier"], folder)
    return folder


def load(folder, root, quant="nf4"):
    return load_causal_lm(folder, "cpu", quant, quantized_dir=root)


def same(a, b) -> bool:
    """The same state dict (every tensor bit for bit) and the same logits on a few tokens."""
    sa, sb = a.state_dict(), b.state_dict()
    ids = torch.tensor([[1, 5, 9, 200, 7]])
    with torch.inference_mode():
        logits = torch.equal(a(ids).logits, b(ids).logits)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa) and logits


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
def test_the_second_load_reads_the_copy_bit_for_bit(source, tmp_path, quant):
    root = tmp_path / "models" / FOLDER
    first = load(source, root, quant)
    (copy,) = copies_of(root, source)
    assert json.loads((copy / MARKER).read_text())["quant"] == quant and copy.name.startswith(f"tiny-1-2-{quant}-")
    marker_time = (copy / MARKER).stat().st_mtime_ns
    second = load(source, root, quant)
    assert (copy / MARKER).stat().st_mtime_ns == marker_time  # read, not written again
    assert same(first, second)
    assert same(first, load(source, None, quant))  # and what quantizing at every load gives


def test_a_damaged_copy_or_a_changed_source_is_quantized_again(source, tmp_path):
    root = tmp_path / "models" / FOLDER
    reference = load(source, root)
    (copy,) = copies_of(root, source)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    assert same(reference, load(source, root))
    assert copies_of(root, source) == [copy] and (copy / "model.safetensors").stat().st_size > weights.stat().st_size // 2

    stat = (source / "model.safetensors").stat()
    os.utime(source / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new conversion
    assert same(reference, load(source, root))
    (newer,) = copies_of(root, source)  # the old copy is gone
    assert newer != copy and not copy.exists()


def test_an_unwritable_cache_costs_only_time(source, tmp_path, read_only):
    root = tmp_path / "models" / FOLDER
    root.mkdir(parents=True)
    with read_only(root):
        model = load(source, root)
    assert same(model, load(source, None)) and not any(root.iterdir())


def test_the_catalog_lists_copies_and_removing_a_model_removes_its_copies(source, tmp_path):
    models = tmp_path / "models"
    load(source, models / FOLDER)
    (copy,) = copies_of(models / FOLDER, source)
    kinds = {entry["name"]: entry["kind"] for entry in cache_entries(models)}
    assert kinds == {"tiny-1-2": "gguf", f"{FOLDER}/{copy.name}": "quantized"}
    removed = remove_cache_entry(models, f"{FOLDER}/{copy.name}")  # a copy alone, by its name
    assert removed["kind"] == "quantized" and not copy.exists() and source.exists()
    load(source, models / FOLDER)
    (copy,) = copies_of(models / FOLDER, source)
    remove_cache_entry(models, "tiny-1-2")
    assert not copy.exists() and cache_entries(models) == []
