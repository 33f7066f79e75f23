"""Random LLaMA-shaped models built on a GPU, for the CUDA tests and scripts/gpu_costs.py.

No hub and no weights travel to a lent GPU (the 7B shape is 13.5 GB in fp16), so the models are
made there: `random_llama` builds a LlamaForCausalLM of a named shape with random weights on the
device (transformers' own init, output layer sharpened like the tiny test models so next-token
distributions are peaked, as a trained LM's are), and `to_nf4` turns a copy of it into the 4-bit
verifier the engine uses, every decoder linear replaced by a bitsandbytes Linear4bit (NF4,
blocksize 64, as `BitsAndBytesConfig(load_in_4bit=True)` would do at load; lm_head and embeddings
stay unquantised, as transformers leaves them).

Shapes are LLaMA's (vocab 32,000): llama-7b, and the two SpecInfer/Sequoia drafters llama-68m and
llama-160m (JackFram's). Token ids are decoded with the SmolLM2 tokenizer that travels with the
repo (ssms/), whose first 32,000 ids are ordinary tokens.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

SHAPES = {
    # name: (hidden, intermediate, layers, heads, kv heads)
    "llama-7b": (4096, 11008, 32, 32, 32),
    "llama-160m": (768, 3072, 12, 12, 12),
    "llama-68m": (768, 3072, 2, 12, 12),
}
VOCAB = 32000
SHARPEN = 8.0  # lm_head scale: top-2 logit gaps of a few units, not the ~0.3 of a plain random init
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "ssms" / "smollm2-boost-1"


def llama_config(shape: str, attn: str = "sdpa"):
    from transformers import LlamaConfig

    hidden, inter, layers, heads, kv = SHAPES[shape]
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    config._attn_implementation = attn
    return config


@torch.no_grad()
def random_llama(shape: str, dtype=torch.float16, seed: int = 0, device: str = "cuda", attn: str = "sdpa"):
    """A LlamaForCausalLM of `shape` with random weights, built on `device` in `dtype`, eval mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(shape, attn)).to(dtype)
    model.lm_head.weight.mul_(SHARPEN)
    model.generation_config.pad_token_id = model.config.eos_token_id
    return model.eval()


@torch.no_grad()
def to_nf4(model, compute_dtype=torch.bfloat16):
    """A copy of `model` whose decoder linears are NF4 (bitsandbytes), computing in `compute_dtype`.

    Everything else (embeddings, norms, lm_head) is cast to compute_dtype, since Linear4bit casts
    its output back to its input's dtype: fp32 compute needs fp32 activations around it.
    """
    import bitsandbytes as bnb

    q = copy.deepcopy(model)
    device = next(model.parameters()).device
    for layer in q.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, linear in list(parent.named_children()):
                if not isinstance(linear, torch.nn.Linear):
                    continue
                new = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                        compute_dtype=compute_dtype, compress_statistics=False, quant_type="nf4",
                                        device="meta")
                new.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, compress_statistics=False,
                                               quant_type="nf4", module=new)
                setattr(parent, name, new.to(device))  # .to(cuda) quantises the weight
                del linear
    for module in q.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            for name, p in module.named_parameters(recurse=False):
                setattr(module, name, torch.nn.Parameter(p.data.to(compute_dtype), requires_grad=False))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return q.eval()


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters and buffers as stored (packed 4-bit counted as stored)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
