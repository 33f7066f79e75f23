"""Layout-invariant attention for CPU: every query row's output depends only on that row and the
keys it may see, never on how many other rows share the call or where masked keys sit.

Why it exists. On CPUs with AVX512-BF16, bitsandbytes runs 4-bit layers through a fused kernel
that rounds each activation row to bf16. That kernel is row-independent (a row gives the same bits
whether it is computed alone or among 64), but rounding to bf16 magnifies any upstream difference
of one fp32 ulp into one bf16 ulp, and 30 layers compound it. SDPA is such a source: a token's
attention output differs in the last bits between a tree pass (T queries, masked keys interleaved)
and a one-token decode (1 query, contiguous keys). Measured on SmolLM2-135M NF4: logits of a
32-token chain in one pass differ from 32 one-token passes by up to 0.47, enough to flip a greedy
token now and then. With this attention the difference is exactly 0.

How. Two routes, each layout-invariant on its own:

  native  On x86 CPUs with AVX2 and a C compiler (kernels/exact_attention.c, built once per process
          by kernels/native.py), calls with a float32 query, a float32 cache, D % 8 == 0 and no mask
          or a bool mask shared by all heads. Per query row, in float32, in a fixed order over only
          the keys the row may see, in cache order:

              s_j = (q . k_j) * scale              (8 lanes over d, then a fixed sum of the lanes)
              m   = max_j s_j
              out = (sum_j exp8(s_j - m) v_j) / (sum_j exp8(s_j - m))     (both sums in ascending j)

          with exp8 a lane-by-lane exponential (kernels/exact_exp.h). Every operation of a row is
          fixed by its query and the keys it sees, so a tree row has the bits of a one-token pass
          over those keys, exactly, whatever the call (the C file's header). Two kernels compute it:
            grouped  one task per (batch, kv head, block of up to 16 tokens): each key and value is
                     loaded once for the task's G x tokens rows. Every call takes it unless one query
                     row would be alone in a task (T = 1 and G = 1) or there would be fewer tasks
                     than threads: then
            per row  one task per query row.
          The two give the same bits (tests/kernels/test_exact_native.py checks it row by row).
  torch   Everything else (another dtype, an additive or per-head mask, no library): scores, softmax
          and the weighted sum in float64, rounded once to the query's dtype:

              s_j = scale * q . k_j          (float64; masked keys get -inf, so exp(s_j - m) = 0 exactly)
              m   = max_j s_j                (exact in any order)
              out = (sum_j e^(s_j - m) v_j) / (sum_j e^(s_j - m))       -> rounded to fp32

          Reordering a float64 sum of float32-derived terms moves it by about 1e-16 relative, 2^29
          times below one fp32 ulp, so the final rounding lands on the same fp32 value except when the
          exact result sits within that distance of a rounding boundary (about one element in 10^8).

The two routes agree to about 1e-6 (float32 against float64), not bit for bit, so a model runs all its
calls through one of them: the route depends only on the machine, the cache's dtype (LeanModel keeps a
float32 cache where the kernels exist, float64 for the torch path) and D, never on the step. Tests check
bitwise equality of tree-pass and one-token logits on the real model.

Cost. The native kernels are compute-bound (FMA chains over 8 float32 lanes). On the 2-core AVX2 EPYC
the float32 kernels take a 770-token prefill's attention to half the time of the float64 ones they
replaced, a decode step's at a 700-token prefix to two thirds (docs/performance.md, stop 60). The torch
path's float64 matmuls are small (T x S x D per head); converting the cache to float64 costs O(S) per
layer and step.
"""

from __future__ import annotations

import ctypes as ct
import functools
from dataclasses import dataclass

import torch

from . import native

PREFILL_CHUNK = 128  # queries per block of a causal prefill

@dataclass(frozen=True)
class PreparedMask:
    """A mask in the layout the scores use, made once per forward rather than once per layer."""

    blocked: torch.Tensor | None  # bool [B|1, Hkv|1, G|1, T, S]: True = may not attend
    additive: torch.Tensor | None  # float64, same layout (an additive mask instead)
    may_see_nothing: bool  # some row may attend to no key (left padding): check for NaN rows
    allowed: torch.Tensor | None = None  # uint8 [B|1, T, S] (1 = may attend): one mask for every head, for the native path


def prepare_mask(mask: torch.Tensor, Hq: int, Hkv: int) -> PreparedMask:
    """bool (True = attend) or additive mask [B|1, 1|Hq, T, S] -> PreparedMask."""
    G = Hq // Hkv
    m = mask.reshape(mask.shape[0], -1, mask.shape[-2], mask.shape[-1])  # [B|1, 1|Hq, T, S]
    m = m.reshape(m.shape[0], Hkv if m.shape[1] == Hq else 1, G if m.shape[1] == Hq else 1, *m.shape[-2:])
    if m.dtype == torch.bool:
        one_mask = m.shape[1] == m.shape[2] == 1  # one for every head: what the native path takes
        allowed = mask.reshape(mask.shape[0], *mask.shape[-2:]).to(torch.uint8) if one_mask else None
        return PreparedMask(~m, None, not bool(m.any(-1).all()), allowed)
    return PreparedMask(None, m.to(torch.float64), True)


def exact_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
    found: Kernels | None = None,
) -> torch.Tensor:
    """query [B, Hq, T, D]; key/value [B, Hkv, S, D] (Hq % Hkv == 0, query head h reads kv head
    h // (Hq / Hkv)); mask None (causal, the T queries being the last T positions), bool
    [B|1, 1|Hq, T, S] (True = attend) or additive float of that shape. Returns [B, Hq, T, D] in
    query's dtype. found: the native kernels as the caller resolved them once (native_attention)."""
    B, Hq, T, D = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    G = Hq // Hkv
    scale = D**-0.5 if scale is None else scale
    native_out = native_attention(query, key, value, mask, scale, found=found)
    if native_out is not None:
        return native_out
    if mask is None and T > PREFILL_CHUNK:  # a causal prefill: query chunk c sees keys < its end only,
        ends = range(PREFILL_CHUNK, T + PREFILL_CHUNK, PREFILL_CHUNK)  # which halves the work; rows unchanged
        return torch.cat([exact_attention(query[:, :, e - PREFILL_CHUNK:min(e, T)], key[:, :, :S - T + min(e, T)],
                                          value[:, :, :S - T + min(e, T)], None, scale) for e in ends], dim=2)
    q = query.to(torch.float64).reshape(B, Hkv, G * T, D)  # heads grouped by their kv head
    k = key.to(torch.float64)  # [B, Hkv, S, D]
    v = value.to(torch.float64)
    scores = (q @ k.transpose(-1, -2)).mul_(scale).view(B, Hkv, G, T, S)
    if mask is None:
        if T > 1:  # query i sits at position S - T + i and sees keys 0 .. S - T + i
            i = torch.arange(T, device=query.device)[:, None] + (S - T)
            j = torch.arange(S, device=query.device)[None, :]
            scores.masked_fill_(j > i, float("-inf"))
    else:
        prepared = mask if isinstance(mask, PreparedMask) else prepare_mask(mask, Hq, Hkv)
        if prepared.blocked is not None:
            scores.masked_fill_(prepared.blocked, float("-inf"))
        else:
            scores.add_(prepared.additive)
    probs = torch.softmax(scores, dim=-1)
    if mask is not None and prepared.may_see_nothing and not bool((scores[..., :1] > float("-inf")).all()):
        probs.nan_to_num_(0.0)  # a row that may see nothing (left padding in a batch) attends to nothing
    probs = probs.view(B, Hkv, G * T, S)
    out = probs @ v  # [B, Hkv, G*T, D]
    return out.view(B, Hq, T, D).to(query.dtype)


# spectui_exact_attention(B, Hq, Hkv, T, S, D, q, k, v, kv_sb, kv_sh, kv_sj, mask, mask_sb, mask_st, scale, out,
#                         threads); spectui_exact_attention_grouped adds tokens_per_block
ARGTYPES = [ct.c_int64] * 6 + [ct.c_void_p] * 3 + [ct.c_int64] * 3 + [
    ct.c_void_p, ct.c_int64, ct.c_int64, ct.c_double, ct.c_void_p, ct.c_int]
GROUPED_ARGTYPES = ARGTYPES + [ct.c_int64]
BLOCKS = (16, 8, 4, 2, 1)  # tokens a task of the grouped kernel, most preferred first


def takes_head_dim(D: int) -> bool:
    """Whether the C kernels take heads of D values (8 float32 lanes at a time, at most 256)."""
    return D % 8 == 0 and D <= 256


@dataclass(frozen=True)
class Kernels:
    """exact_attention.c's functions in this process's build."""

    library: ct.CDLL
    rows: ct._CFuncPtr  # spectui_exact_attention: a task per query row
    grouped: ct._CFuncPtr  # spectui_exact_attention_grouped: a task per (batch, kv head, block of tokens)


_KERNELS: dict[int, Kernels] = {}  # id(library) -> its Kernels


def kernels() -> Kernels | None:
    """This process's kernels, or None (no compiler, no AVX2, SPECTUI_CPU_KERNELS=0: read on every call)."""
    lib, _ = native.get("exact_attention")
    if lib is None:
        return None
    found = _KERNELS.get(id(lib))
    if found is None:
        rows, _ = native.function("exact_attention", "spectui_exact_attention", ARGTYPES)
        grouped, _ = native.function("exact_attention", "spectui_exact_attention_grouped", GROUPED_ARGTYPES)
        found = _KERNELS[id(lib)] = Kernels(lib, rows, grouped)
    return found


def empty_rows(G: int, T: int, block: int) -> int:
    """Rows the grouped kernel's tiles of 4 leave empty over the blocks of a kv head: a task of t tokens
    has t G rows, padded to a multiple of 4."""
    full, rest = divmod(T, block)
    return sum(-(-rows // 4) * 4 - rows for rows in [block * G] * full + ([rest * G] if rest else []))


@functools.lru_cache(maxsize=1024)
def tokens_per_task(B: int, Hq: int, Hkv: int, T: int, threads: int) -> int | None:
    """The grouped kernel's tokens a task: of BLOCKS giving every thread a task, the one whose tiles leave
    the fewest rows empty, then giving every thread two tasks, then the most tokens; None (the per-row
    kernel) where a row would be alone in its task or a thread would stay idle. (With 3 query heads a kv
    head, a block of 1 or 2 tokens leaves a quarter of each tile empty: at T = 4 a block of 4 ran 6-15 %
    faster than one of 2, prefixes 100-800, on a 2-core AVX2 EPYC; docs/performance.md.)"""
    if T == 1 and Hq == Hkv:
        return None
    tasks = {b: B * Hkv * -(-T // b) for b in BLOCKS}
    fits = [b for b in BLOCKS if tasks[b] >= threads]
    if not fits:
        return None
    return min(fits, key=lambda b: (empty_rows(Hq // Hkv, T, min(b, T)), tasks[b] < 2 * threads, BLOCKS.index(b)))


def native_attention(query, key, value, mask, scale: float, block: int | None = None,
                     found: Kernels | None = None) -> torch.Tensor | None:
    """exact_attention.c's result [B, Hq, T, D] float32, or None where it does not apply (not a float32
    CPU query and cache, keys and values not alike in strides, D not a multiple of 8, an additive or
    per-head mask, no library).
    block: tokens a task of the grouped kernel, 0 for the per-row kernel, None as tokens_per_task routes.
    found: kernels() as a caller resolved it once (LeanModel: a lookup a layer costs ~10 us)."""
    B, Hq, T, D = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    if (query.device.type != "cpu" or query.dtype != torch.float32 or key.dtype != torch.float32
            or value.dtype != torch.float32 or key.stride() != value.stride() or key.stride(3) != 1
            or not takes_head_dim(D) or Hq % Hkv or key.shape[0] != B or S < T):
        return None
    allowed = None
    if mask is not None:
        if isinstance(mask, PreparedMask):
            allowed = mask.allowed
        elif mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1:
            allowed = mask[:, 0].to(torch.uint8)  # [B|1, T, S]
        if allowed is None:
            return None
        allowed = allowed.contiguous()
        if allowed.shape[-2:] != (T, S):
            return None
    found = found or kernels()
    if found is None:
        return None
    threads = torch.get_num_threads()
    block = tokens_per_task(B, Hq, Hkv, T, threads) if block is None else block
    q = query.contiguous()  # [B, Hq, T, D]
    out = torch.empty(B, Hq, T, D, dtype=torch.float32)
    mask_sb = 0 if allowed is None or allowed.shape[0] == 1 else allowed.stride(0)
    args = (B, Hq, Hkv, T, S, D, q.data_ptr(), key.data_ptr(), value.data_ptr(), key.stride(0), key.stride(1),
            key.stride(2), None if allowed is None else allowed.data_ptr(), mask_sb,
            0 if allowed is None else allowed.stride(1), float(scale), out.data_ptr(), threads)
    if found.grouped(*args, block) if block else found.rows(*args):
        raise MemoryError("the exact attention kernel could not allocate its scratch")
    return out
