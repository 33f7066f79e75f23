"""Launch planning of the Triton tree-attention kernel (triton_tree.py): tile sizes, warps, stages and
prefix splits for one launch, from the shapes and the GPU's SM count. Pure Python; the CUDA device is
asked only for its properties, so a plan can be made (and tested) without running a kernel.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton


@functools.lru_cache(maxsize=None)
def _gpu(index: int) -> tuple[int, int]:
    """(SM count, compute-capability major) of CUDA device `index`."""
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, props.major


def _launch_config(block_m: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int]:
    """(num_warps, num_stages, resident programs per SM) for the forward kernel.

    Measured offline with ptxas (sm_90, fp16, D=128, no register spills): BLOCK_M <= 64 with 4 warps
    and 2 stages is ~235 regs / 82 KB smem -> 2 programs per SM; BLOCK_M = 128 with 8 warps and
    3 stages is ~200 regs / 130 KB smem -> 1 per SM (2 stages before Hopper: 99 KB smem cards).
    """
    if dtype == torch.float32:  # no tensor-core path at ieee precision: keep it small
        return 4, 1, 1
    if block_m >= 128:
        major = _gpu(_index(device))[1] if device.type == "cuda" else 9
        return 8, 3 if major >= 9 else 2, 1
    return 4, 2, 2


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _auto_splits(base_programs: int, per_sm: int, n_blocks: int, device: torch.device) -> int:
    """Prefix splits so the grid fills one wave of resident programs (never more than one wave:
    a second, mostly empty wave would double the time), keeping >= 2 tiles per split."""
    if device.type != "cuda" or n_blocks == 0:
        return 1
    slots = _gpu(_index(device))[0] * per_sm
    return max(1, min(slots // base_programs, n_blocks // 2, 64))


class LaunchPlan(NamedTuple):
    """Tile sizes, grid and launch options of one forward launch (see `launch_plan`)."""

    block_d: int
    block_m: int
    block_n: int
    grid_m: int  # programs along the [G * T] rows
    splits: int  # prefix splits actually launched (grid axis 2)
    blocks_per_split: int
    num_warps: int
    num_stages: int


def launch_plan(
    B: int, Hq: int, Hkv: int, T: int, D: int, prefix_len: int, dtype: torch.dtype, device: torch.device | str,
    *, num_splits: int | None = None, block_n: int | None = None, num_warps: int | None = None,
    num_stages: int | None = None,
) -> LaunchPlan:
    """What `tree_attention_triton` launches for these shapes; None keeps the heuristic choice.

    block_n: prefix / tree tile width, a power of two from 32 to 256 (tree bits come in 32-bit words);
    num_warps: a power of two from 1 to 16; num_stages >= 1 (software-pipelining depth).
    """
    device = torch.device(device)
    if block_n is not None and block_n not in (32, 64, 128, 256):
        raise ValueError(f"tree_attention: block_n must be 32, 64, 128 or 256, got {block_n!r}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"tree_attention: num_warps must be a power of two from 1 to 16, got {num_warps!r}")
    if num_stages is not None and (isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1):
        raise ValueError(f"tree_attention: num_stages must be an int >= 1, got {num_stages!r}")
    G = Hq // Hkv
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_M = min(128 if BLOCK_D <= 128 and dtype != torch.float32 else 64, max(16, triton.next_power_of_2(G * T)))
    BLOCK_N = 64 if block_n is None else block_n  # also the tree tile width; a multiple of 32 (bit words)
    grid_m = triton.cdiv(G * T, BLOCK_M)
    n_blocks = triton.cdiv(prefix_len, BLOCK_N)
    warps, stages, per_sm = _launch_config(BLOCK_M, dtype, device)
    if num_splits is None:
        num_splits = _auto_splits(grid_m * B * Hkv, per_sm, n_blocks, device)
    splits = max(1, min(int(num_splits), max(n_blocks, 1)))
    blocks_per_split = triton.cdiv(n_blocks, splits) if n_blocks else 0
    splits = triton.cdiv(n_blocks, blocks_per_split) if n_blocks else 1  # no empty prefix splits
    return LaunchPlan(BLOCK_D, BLOCK_M, BLOCK_N, grid_m, splits, blocks_per_split,
                      warps if num_warps is None else num_warps, stages if num_stages is None else num_stages)
