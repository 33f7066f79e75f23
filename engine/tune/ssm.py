"""Build a small speculative model (SSM) for a verifier: a tiny LLaMA sharing its vocabulary.

Defaults (hidden 128, 2 layers, 4 heads, 2 kv heads, MLP 384): about 6.3 M parameters in the
tied embedding (49152 x 128) and 0.5 M in the layers; the vocabulary projection dominates both
the size (12.6 MB in bf16) and the compute, so it is tied to the input embedding.

The tied embedding starts from the verifier's token geometry: the top principal components of
the verifier's input embedding E [V, D]. With C = cov(E) = V_D diag(s) V_D^T and V_h its top-h
eigenvectors [D, h], the SSM embedding is

    E_ssm = E V_h  [V, h]        (the best rank-h linear view of E: tokens that are close stay close)

rescaled to the initializer's per-entry scale, so training starts from sensible token neighbours
instead of noise. Columns beyond D (an SSM wider than its verifier) keep the random init.
"""

from __future__ import annotations

import torch


def ssm_config(verifier_config, cfg):
    """A LlamaConfig with the verifier's vocabulary, special ids, positions and RoPE."""
    from transformers import LlamaConfig

    v = verifier_config
    rope = getattr(v, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(v, "rope_theta", 10000.0)}
    return LlamaConfig(
        vocab_size=v.vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        max_position_embeddings=v.max_position_embeddings,
        rms_norm_eps=getattr(v, "rms_norm_eps", 1e-5),
        rope_parameters=dict(rope),
        bos_token_id=v.bos_token_id,
        eos_token_id=v.eos_token_id,
        pad_token_id=getattr(v, "pad_token_id", None),
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
    )


def principal_embedding(embedding: torch.Tensor, width: int) -> torch.Tensor:
    """E [V, D] -> E V_w [V, min(w, D)]: coordinates in the top principal directions (largest first)."""
    e = embedding.detach().float()
    centred = e - e.mean(dim=0, keepdim=True)  # [V, D]
    cov = centred.T @ centred / max(e.shape[0] - 1, 1)  # [D, D]
    _, vectors = torch.linalg.eigh(cov)  # eigenvalues ascending, vectors [D, D] in columns
    top = vectors[:, -min(width, e.shape[1]) :].flip(-1)  # [D, w], largest variance first
    return e @ top  # [V, w]


def build_ssm(verifier, cfg, seed: int = 0):
    """A fresh SSM (fp32) whose tied embedding starts from the verifier's principal components."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(ssm_config(verifier.config, cfg))
    with torch.no_grad():
        source = verifier.get_input_embeddings().weight  # [V, D] (bitsandbytes leaves embeddings unquantised)
        target = model.get_input_embeddings().weight  # [V, h]
        pca = principal_embedding(source[: target.shape[0]], target.shape[1]).to(target.device)  # [V, w]
        scale = target.std() / pca.std().clamp_min(1e-8)  # match the initializer's entry scale
        target[: pca.shape[0], : pca.shape[1]] = pca * scale
    model.tie_weights()
    return model


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
