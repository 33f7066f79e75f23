"""LeanModel: a LLaMA-family verifier run layer by layer, with its KV cache, on the exact CPU path.

A drop-in for CachedModel (same methods: forward_chain, forward_tree, keep, crop, rewind, reset,
length) that does a decode step's work and nothing else. transformers' forward spends more time
around the model than in it on this CPU: per layer, module calls, mask and cache bookkeeping, and
seven Linear4bit wrappers (casts, dispatch, allocation) around 3-8 us kernels. Here:

  * the 4-bit projections that share an input are one direct kernel call (kernels/packed_4bit.py):
    q|k|v, gate|up, then o and down: 4 calls a layer instead of 7 module calls;
  * the KV cache is one buffer for all layers, [L, 2, B, Hkv, capacity, D]: float32 where the exact
    attention's C kernels run (they compute in float32); float64 where its torch path runs (which
    computes in float64 and would convert the whole prefix on every call);
    compaction of the accepted path is one index_select over all layers;
  * rotary cos/sin are computed once a forward by the model's own rotary module;
  * where spectui's C kernels run the 4-bit layers, the glue is C with torch's bits
    (kernels/glue_cpu.c): each norm is one call (the sum of squares in torch's own order, checked
    at first use), rotary of q and k with both cache writes another, silu(gate) * up a third
    (torch's own Sleef exp, checked at load), and o's and down's outputs are added into the
    residual stream as they come out of the 4-bit kernel: about 30 torch ops a layer become 9
    calls. With kernels/packed_4bit.c (AVX512-BF16) the norms and silu * up round to bf16 as that
    kernel reads; with kernels/nf4_cpu.c (AVX2) everything stays fp32, as transformers computes,
    and kernels/stack_cpu.c makes those calls for every layer in one call from Python (a pass of
    up to 64 rows of one sequence): about 3 ms less a one-token step on a 2-core AVX2 machine;
  * the cache's views for all layers are made once a call, not a dozen a layer.

The engine feeds one sequence (B = 1); `run` also takes B left-padded sequences at once, which
engine/batch_generate.py uses to answer many prompts together (spectui tune's data).

The arithmetic is transformers' op for op (LlamaDecoderLayer, LlamaRMSNorm, apply_rotary_pos_emb,
LlamaMLP, the exact attention, the model's own lm_head), so logits are the same bits as
CachedModel's (tests/engine/test_lean_model.py compares them on the embedded model and on tiny
random ones, prefill, one-token steps and tree passes), and greedy decoding stays identical to
transformers' generate. Per layer, for T new tokens at positions p_t:

    x      = rms(h) * w_in                       rms(h) = h / sqrt(mean(h^2) + eps)       [T, H]
    q|k|v  = x W_qkv^T                           -> [Hq, T, D], [Hkv, T, D], [Hkv, T, D]
    q, k   = q cos(p) + rot(q) sin(p), same for k                rot(a|b) = (-b | a)
    h      = h + attention(q, K, V, mask) W_o^T  K, V: the cache, then these T rows
    x      = rms(h) * w_post
    h      = h + (silu(x W_gate^T) * x W_up^T) W_down^T

`supports(model)` says when it applies: a LlamaForCausalLM on CPU with no biases, SiLU and full
attention in every layer, and either the exact attention (the verifier: everything above holds)
or SDPA (an SSM: the cache in the model's dtype, SDPA with the tree mask, and dense projections
that share an input stacked into one matmul; an SSM's drafts need to be cheap, not bit-exact).
Anything else keeps CachedModel (`runner_for`).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..kernels.argmax_head import ArgmaxScreen, screen_supported
from ..kernels.dense_cpu import drafter_kernel
from ..kernels.exact_attention import exact_attention, prepare_mask, takes_head_dim
from ..kernels.exact_attention import kernels as exact_kernels
from ..kernels.glue_cpu import glue
from ..kernels.guarded_head import GuardedHead
from ..kernels.hf_attention import EXACT_NAME
from ..kernels.nf4_cpu import KernelMatmul, kernel_group
from ..kernels.packed_4bit import Packed4bit, pack_group
from ..kernels.stack_cpu import stack_for
from .cached_model import CachedModel, tree_pass
from .tree import TokenTree

MIN_CAPACITY = 256  # cache positions allocated at least, and kept free beyond a prompt when the cache grows
ENV_VAR = "SPECTUI_RUNNER"  # "transformers" keeps transformers' forward (for comparison); default auto


def supports(model) -> bool:
    """True if LeanModel runs this model: a LLaMA on CPU with the exact attention (the verifier,
    reproduced bit for bit) or SDPA (an SSM drafting), no biases, SiLU, full attention everywhere."""
    config = model.config
    return (
        type(model).__name__ == "LlamaForCausalLM"
        and next(model.parameters()).device.type == "cpu"
        and getattr(config, "_attn_implementation", None) in (EXACT_NAME, "sdpa")
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "sliding_window", None)
        and not getattr(config, "pretraining_tp", 1) > 1
    )


def runner_for(model, drafting: bool = False):
    """LeanModel where it applies (and SPECTUI_RUNNER is not "transformers"), else CachedModel.
    drafting: the model only drafts (an SSM), so its dense layers may take kernels/dense_cpu.py."""
    if os.environ.get(ENV_VAR, "auto").strip().lower() != "transformers" and supports(model):
        return LeanModel(model, drafting)
    return CachedModel(model)


class Projection:
    """x [T, H] -> cat(module_1(x), ..., module_k(x)) [T, N]: one fused 4-bit call where bitsandbytes'
    CPU kernel runs these modules; one matmul over their stacked weights for plain bias-free Linears
    when `stack_dense` (an SSM: not the same rounding as separate products, which only an exact
    verifier needs), through kernels/dense_cpu.py for a drafter (`drafting`: bf16 weights, never a
    verifier's) where that serves this CPU; else the modules themselves."""

    def __init__(self, modules, stack_dense: bool = False, drafting: bool = False) -> None:
        self.modules = list(modules)
        self.packed = pack_group(self.modules) or kernel_group(self.modules)  # AVX512-BF16: bitsandbytes'; else ours
        self.stacked = None
        if self.packed is None and stack_dense and all(type(m) is torch.nn.Linear and m.bias is None for m in modules):
            self.stacked = torch.cat([m.weight for m in self.modules]).detach()  # [N, H]
        self.dense = drafter_kernel(self.stacked) if drafting and self.stacked is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(x)
        if self.dense is not None:
            return self.dense(x).to(x.dtype)
        if self.stacked is not None:
            return F.linear(x, self.stacked)
        outs = [m(x) for m in self.modules]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class Layer:
    def __init__(self, layer, stack_dense: bool, drafting: bool = False) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.norm_in = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        self.norm_post = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        self.qkv = Projection([attn.q_proj, attn.k_proj, attn.v_proj], stack_dense, drafting)
        self.o = Projection([attn.o_proj], stack_dense, drafting)
        self.gate_up = Projection([mlp.gate_proj, mlp.up_proj], stack_dense, drafting)
        self.down = Projection([mlp.down_proj], stack_dense, drafting)
        self.scaling = attn.scaling


def rms_norm(h: torch.Tensor, norm) -> torch.Tensor:
    """LlamaRMSNorm: fp32 statistics, weight * normalised h."""
    weight, eps = norm
    dtype = h.dtype
    h = h.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb for one tensor: x [B, H, T, D], cos/sin [B, 1, T, D]."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


class LeanModel:
    def __init__(self, model, drafting: bool = False) -> None:
        config = model.config
        self.model = model
        self.device = torch.device("cpu")
        self.embed = model.model.embed_tokens
        self.rotary = model.model.rotary_emb
        self.norm = (model.model.norm.weight, model.model.norm.variance_epsilon)
        self.head = model.lm_head
        self.exact = config._attn_implementation == EXACT_NAME  # else SDPA, in the model's dtype
        drafting = drafting and not self.exact  # an SSM: drafts need speed, not the verifier's rounding
        plain_head = drafting and getattr(self.head, "bias", None) is None
        # a stand-in for the model's output layer: an SSM's in kernels/dense_cpu.py, or training data's
        # (engine/tune/teacher_head.py, set by its caller); never on a verifier that decodes for a user
        self.output_layer = drafter_kernel(self.head.weight) if plain_head else None
        self.layers = [Layer(layer, not self.exact, drafting) for layer in model.model.layers]
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        native = exact_kernels() is not None and takes_head_dim(self.head_dim)
        self.cache_dtype = ((torch.float32 if native else torch.float64) if self.exact
                            else model.model.embed_tokens.weight.dtype)
        self.attention_kernels = exact_kernels() if self.exact else None  # exact_attention.c, or None
        self.glue, self.glue_fp32 = self._glue(model)  # the layers' glue in C (glue_cpu.py), or None: torch's ops
        self.stack = stack_for(self)  # that glue path for all layers in one call (stack_cpu.py), or None
        self.rotary_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [n, D] (rotary_rows)
        self.kv = None  # [L, 2, B, Hkv, capacity, D] cache_dtype, allocated at first use
        self._length = 0
        self.keep_hidden = False  # keep `hidden`: the final normed hidden states of every row of the last run
        self.hidden: torch.Tensor | None = None  # [B, T, H]
        self.argmax_only = False  # logits only for their argmax: the bf16 screen (kernels/argmax_head.py)
        self.argmax_rows: list[int] | None = None  # the last run's argmax of each logits row, where the screen knew them
        self._screen: ArgmaxScreen | None = None

    @property
    def thread_invariant(self) -> bool:
        """True if a pass's bits do not depend on the thread count: an exact verifier whose layers all run
        spectui's C kernels and glue (tests/kernels check each at 1 and 2 threads; test_threads_under_load.py the
        logits), so the engine may change its threads between passes (threads.py)."""
        return self.glue is not None

    def _glue(self, model):
        """(kernels/glue_cpu.py, its fp32 flavour?) where its bits are the torch ops': an exact verifier in
        fp32 with a float32 cache whose 4-bit layers all run kernels/packed_4bit.c (it reads bf16 rows, so
        the norms round to bf16 as they write, and it adds o's and down's outputs into the residual
        stream itself) or all kernels/nf4_cpu.c (fp32 rows); else (None, False)."""
        fp32 = all(norm[0].dtype == torch.float32 for layer in self.layers for norm in (layer.norm_in, layer.norm_post))
        projections = [p.packed for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        packed = all(isinstance(p, Packed4bit) and p.own is not None for p in projections)  # kernels/packed_4bit.c
        ours = all(isinstance(p, KernelMatmul) for p in projections)  # kernels/nf4_cpu.c
        if not (self.exact and self.cache_dtype == torch.float32 and fp32 and (packed or ours)
                and model.model.embed_tokens.weight.dtype == torch.float32 and self.norm[0].dtype == torch.float32):
            return None, False
        found = glue()
        if found is None:
            return None, False
        return found, not packed

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        """Empty the cache. Its memory stays for the next sequence: a fresh one would be faulted in page by
        page during the prefill and, sized to the prompt, copied to a larger one at the first step."""
        self._length = 0

    def _reserve(self, batch: int, needed: int) -> None:
        if self.kv is not None and self.kv.shape[2] != batch:
            if self._length:
                raise ValueError(f"the cache holds {self.kv.shape[2]} sequences, not {batch}: reset it first")
            self.kv = None
        capacity = 0 if self.kv is None else self.kv.shape[4]
        if needed <= capacity:
            return
        capacity = max(2 * capacity, needed + MIN_CAPACITY)  # room for the answer beyond a prompt
        kv = torch.empty(len(self.layers), 2, batch, self.kv_heads, capacity, self.head_dim, dtype=self.cache_dtype)
        if self._length:
            kv[..., : self._length, :] = self.kv[..., : self._length, :]
        self.kv = kv

    @torch.inference_mode()
    def forward_chain(self, tokens: list[int], last_only: bool = False) -> torch.Tensor:
        """Append a causal chain of tokens to the cache; logits [T, V] in fp32 ([1, V] if last_only)."""
        positions = torch.arange(self._length, self._length + len(tokens))[None]  # [1, T]
        return self.run(torch.tensor([tokens]), positions, None, last_only)[0]

    @torch.inference_mode()
    def forward_tree(self, tree: TokenTree, nodes: list[int] | None = None) -> torch.Tensor:
        """Append tree nodes (default all, in order) to the cache in one pass; logits [len(nodes), V].
        As CachedModel.forward_tree: with `nodes` a suffix, the earlier nodes are in the cache already."""
        tokens, positions, mask = tree_pass(tree, self._length, nodes, self.device)
        return self.run(torch.tensor([tokens]), positions[None], mask, False)[0]

    @torch.inference_mode()
    def run(self, ids: torch.Tensor, positions: torch.Tensor, mask, last_only: bool = False) -> torch.Tensor:
        """Append T tokens to each of B sequences: ids and positions [B, T]; mask bool [B|1, 1, T, S]
        (True = attend; S = cached + T) or None (causal). Logits [B, T, V] fp32 ([B, 1, V] if last_only)."""
        (B, T), start = ids.shape, self._length
        self._reserve(B, start + T)
        S = start + T
        h = self.embed(ids)  # [B, T, H]
        cos, sin = self.rotary_rows(h, positions)  # [B, T, D] each
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]: every head
        Hq, Hkv, D = self.heads, self.kv_heads, self.head_dim
        if mask is not None and self.exact:
            mask = prepare_mask(mask, Hq, Hkv)  # once for all layers
        glue = self.glue if B == 1 else None
        keys, values = self.kv[:, 0, :, :, :S], self.kv[:, 1, :, :, :S]  # [L, B, Hkv, S, D]: views made once a call
        if glue is not None:
            cos2, sin2 = cos[0, 0].contiguous(), sin[0, 0].contiguous()  # [T, D]
            new_k, new_v = keys[:, 0, :, start:], values[:, 0, :, start:]  # [L, Hkv, T, D]
            rows = h.view(T, -1)  # [T, H]: h is this call's own tensor (the embedding's), updated in place
        if glue is not None:  # the flavour the 4-bit kernels read: fp32 (nf4_cpu.c) or bf16 (packed_4bit.c) rows
            norm, act = (glue.rms_norm_f32, glue.silu_mul_f32) if self.glue_fp32 else (glue.rms_norm_bf16, glue.silu_mul_bf16)
        stacked = glue is not None and self.stack is not None and self.stack.applies(T, S, mask)
        if stacked:  # every layer in one call (kernels/stack_cpu.c): the loop below, op for op
            self.stack(rows, cos2, sin2, self.kv, start, mask)
        for index, layer in enumerate([] if stacked else self.layers):
            if glue is not None:  # the same bits as the torch ops below, in fewer calls
                x = norm(rows, *layer.norm_in)  # [T, H]
                q = glue.rope_store(layer.qkv(x), cos2, sin2, Hq, Hkv, new_k[index], new_v[index])  # [1, Hq, T, D]
            else:
                x = rms_norm(h, layer.norm_in).view(B * T, -1)
                qk, v = layer.qkv(x).split([(Hq + Hkv) * D, Hkv * D], dim=-1)  # [BT, (Hq+Hkv)*D], [BT, Hkv*D]
                qk = rotate(qk.view(B, T, Hq + Hkv, D).transpose(1, 2), cos, sin)  # [B, Hq+Hkv, T, D]: q and k at once
                keys[index][:, :, start:] = qk[:, Hq:]
                values[index][:, :, start:] = v.view(B, T, Hkv, D).transpose(1, 2)
                q = qk[:, :Hq]
            out = self.attend(q, keys[index], values[index], mask, layer.scaling)  # [B, Hq, T, D]
            out = out.transpose(1, 2).reshape(B * T, Hq * D)  # [BT, Hq*D]
            if glue is not None:  # h += o(out), then h += down(silu(gate) * up), added as the 4-bit products come out
                layer.o.packed(out, into=rows)
                x = norm(rows, *layer.norm_post)
                layer.down.packed(act(layer.gate_up(x)), into=rows)
            else:
                h = h + layer.o(out).view(B, T, -1)  # [B, T, H]
                x = rms_norm(h, layer.norm_post).view(B * T, -1)
                gate, up = layer.gate_up(x).chunk(2, dim=-1)  # [BT, I] each
                h = h + layer.down(F.silu(gate) * up).view(B, T, -1)
        self._length = S
        final = self.final_norm if glue is not None else (lambda x: rms_norm(x, self.norm))
        if self.keep_hidden:  # every row's final hidden state, for a feature drafter (feature_drafter.py)
            self.hidden = final(h)  # [B, T, H]
            h = self.hidden[:, -1:] if last_only else self.hidden
        else:
            h = final(h[:, -1:] if last_only else h)  # [B, T or 1, H]
        return self.output(h.reshape(-1, h.shape[-1])).view(B, h.shape[1], -1)  # [B, T or 1, V]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The model's last RMSNorm of one sequence's rows h [1, T, H] fp32 through the C glue: torch's bits
        (glue_cpu.py checks its sum of squares against torch's), one call instead of eight ops."""
        return self.glue.rms_norm_f32(h.reshape(h.shape[1], -1), *self.norm).view(h.shape)

    def rotary_rows(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, D] for positions [B, T]: the model's rotary module's, read from a table it made
        for positions 0 .. n - 1 at once (its output for a position is that position times each frequency,
        then cos and sin, element by element: the same bits in a table as alone); made again twice as
        long when a position passes its end. Rotary types whose output depends on more than the position
        (dynamic scaling) call the module every pass."""
        if getattr(self.rotary, "rope_type", "default") != "default" or positions.numel() == 0:
            return self.rotary(h, positions)
        last = int(positions.max())
        if self.rotary_table is None or last >= self.rotary_table[0].shape[0]:
            n = max(MIN_CAPACITY, 2 * last + 2)
            cos, sin = self.rotary(h, torch.arange(n)[None])  # [1, n, D] each
            self.rotary_table = (cos[0], sin[0])
        cos, sin = self.rotary_table
        return cos[positions], sin[positions]  # [B, T, D]

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> logits [N, V] fp32; argmax-only ones from the screen when `argmax_only` is set
        and the screen applies (an exact verifier's GuardedHead on a CPU with AVX512-BF16); from
        `output_layer` where one is set. Sets `argmax_rows` (None but where the screen gave them)."""
        self.argmax_rows = None
        if self.output_layer is not None:
            return self.output_layer(h)
        if self.argmax_only and isinstance(self.head, GuardedHead) and screen_supported():
            if self._screen is None:
                self._screen = ArgmaxScreen(self.head)
            logits = self._screen(h)
            self.argmax_rows = self._screen.tokens
            return logits
        return self.head(h).float()

    @torch.inference_mode()
    def prefill_left_padded(self, prompts: list[list[int]], every_row=None) -> torch.Tensor:
        """Start B sequences left-padded to the longest prompt (W tokens), each prefilled alone.

        A batched prefill computes attention over the padding too ([B, W, W] per head: most of a
        batch's time when one prompt is long); alone, each prompt costs its own length and takes the
        causal path (no mask, blocks of queries); a prompt met again takes the first one's key/values
        and logits (without every_row). Prompt b's key/values land in columns
        [W - len_b, W) of the batch cache at positions 0 .. len_b - 1, where a left-padded batch puts
        them; padding columns hold zeros that the caller masks. Returns the logits after each prompt,
        [B, V]. every_row(b, logits [len_b, V], hidden [len_b, H]): called with every row of prompt b
        (hidden: `keep_hidden` must be set), for feature data (batch_generate.py)."""
        B, W = len(prompts), max(map(len, prompts))
        rows, batch, seen = [], None, {}
        for b, prompt in enumerate(prompts):
            first = seen.setdefault(tuple(prompt), b) if every_row is None else b
            if first != b:  # the same prompt again (a Magpie round's): its rows are the first one's, bit for bit
                batch[:, :, b] = batch[:, :, first]
                rows.append(rows[first])
                continue
            self.reset()
            if every_row is None:
                rows.append(self.forward_chain(list(prompt), last_only=True))  # [1, V]
            else:
                logits = self.forward_chain(list(prompt))  # [len_b, V]
                every_row(b, logits, self.hidden[0])
                rows.append(logits[-1:])
            if batch is None:
                batch = torch.zeros(*self.kv.shape[:2], B, *self.kv.shape[3:4], max(MIN_CAPACITY, W),
                                    self.head_dim, dtype=self.cache_dtype)  # [L, 2, B, Hkv, capacity, D]
            batch[:, :, b, :, W - len(prompt) : W] = self.kv[:, :, 0, :, : len(prompt)]
        self.kv, self._length = batch, W
        return torch.cat(rows)  # [B, V]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float) -> torch.Tensor:
        """q [B, Hq, T, D] over keys/values [B, Hkv, S, D]; mask bool [B|1, 1, T, S] or None (causal)."""
        if self.exact:  # the native kernels resolved once, not looked up every layer
            return exact_attention(q, k, v, mask, scale, found=self.attention_kernels)
        T, S = q.shape[2], k.shape[2]
        if mask is None and T > 1:  # causal, the T queries being the last T positions
            mask = torch.ones(T, S, dtype=torch.bool).tril_(S - T)[None, None]  # [1, 1, T, S]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)

    @torch.inference_mode()
    def keep(self, positions: list[int]) -> None:
        """Keep only these sequence positions of the cache, in this order (positions[j] >= j)."""
        first = next((j for j, p in enumerate(positions) if p != j), len(positions))
        if first < len(positions):
            source = torch.tensor(positions[first:], dtype=torch.long)
            self.kv[..., first : len(positions), :] = self.kv.index_select(4, source)
        self._length = len(positions)

    @torch.inference_mode()
    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these sequences of a batched cache, in this order (batch_generate drops finished ones)."""
        L, two, _, Hkv, capacity, D = self.kv.shape
        kv = torch.empty(L, two, len(rows), Hkv, capacity, D, dtype=self.kv.dtype)  # [L, 2, B', Hkv, capacity, D]
        for j, row in enumerate(rows):
            kv[:, :, j, :, : self._length] = self.kv[:, :, row, :, : self._length]
        self.kv = kv

    def crop(self, length: int) -> None:
        """Drop everything after the first `length` positions."""
        self._length = min(self._length, max(length, 0))

    rewind = CachedModel.rewind
