"""FeatureHead: a drafter that reads the verifier's own features (EAGLE, Li et al. 2024).

An independent small model must guess the verifier's next token from the text alone. The verifier
has already computed far more: its final hidden state f_t after every accepted token, from which
its next token is argmax(W f_t) (W its output layer). EAGLE observes that the sequence of these
features is easy to continue: one decoder layer, given f_{t-1} and the embedding of the token x_t
that came after it, predicts f_t; the verifier's own output layer turns that into a draft token,
and the predicted feature feeds the next draft step.

    u_t   = W_fc [e(x_t) ; f_{t-1}] + b_fc                      [T, 2H] -> [T, H]
            (prev_token: W_fc [e(x_t) ; f_{t-1} ; e(x_{t-1})] + b_fc, [T, 3H] -> [T, H]; below)
    f^_t  = DecoderLayer(u_{<=t}, positions)                    [T, H]   (causal attention, RoPE)
    q_t   = softmax(W_draft f^_t)                               [T, Vd]

W_draft is the rows of the verifier's output layer for the Vd tokens the head may draft (the ones
the verifier emits most often, FR-Spec): the full layer (49,152 x 576 here) would cost more than
the rest of the head, and the saved head keeps only their ids. The verifier's embedding e is
borrowed likewise. The head's own parameters are W_fc and the layer: about 4 M for H = 576.

The previous token (`prev_token`). With one layer the head copies poorly: to continue "CRISPR-Cas" with
"9" as an earlier "Cas9" did, a query for "Cas" must find the key of the position after an earlier
"Cas", and a key holds only its own token and the verifier's feature before it (which predicts that
token rather than naming the one before). Transformers copy with two layers (a previous-token head,
then an induction head); here the token before each position joins its input instead, so its key
can hold it. Where the verifier was sure (top-1 >= 0.8) of a token that continued a pair seen earlier
in the sequence, the one-input head agreed on 60 % of the Vicuna answers' such tokens and 48 % of
Spec-Bench's, against 66 % and 77 % where it was as sure of a token it could not copy. Two epochs of
fine-tuning the shipped head with the new input (its columns from zero) on 170k positions did not
raise either (docs/tuning.md, stop 49); a head trained with it from the start is yet to be measured.

Training (engine/tune/feature_train.py): on the verifier's features over real text (teacher-forced,
engine/tune/features.py), L = smooth_l1(f^_t, f_t) + cls_weight * CE(q_t, p_t), with p_t the
verifier's top-K distribution at t restricted to the draft vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.dense_cpu import drafter_kernel
from ..kernels.head_layer import head_layer
from .lean_model import rms_norm, rotate  # the verifier's own RMSNorm and rotary arithmetic

CONFIG_FILE = "feature_head.json"
LINEARS = ("fc", "qkv", "o", "gate_up", "down")
WEIGHTS_FILE = "feature_head.safetensors"


@dataclass
class FeatureHeadConfig:
    hidden: int = 576  # the verifier's hidden size
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    intermediate: int = 1536
    rope_theta: float = 100_000.0
    rms_eps: float = 1e-5
    draft_vocab: int = 8192  # tokens the head can draft
    prev_token: bool = False  # the input also holds the previous token's embedding (the module docstring)

    @classmethod
    def for_verifier(cls, config, draft_vocab: int = 8192) -> "FeatureHeadConfig":
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(config, "rope_theta", 10_000.0)
        heads = config.num_attention_heads
        return cls(hidden=config.hidden_size, heads=heads, kv_heads=config.num_key_value_heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   intermediate=config.intermediate_size, rope_theta=float(rope),
                   rms_eps=float(config.rms_norm_eps), draft_vocab=draft_vocab)


def rope(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> cos, sin [B, 1, T, D] (LLaMA's rotary: frequencies theta^(-2i/D), halves rotated)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)  # [D/2]
    angles = positions[..., None].float() * inv  # [B, T, D/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


class FeatureHead(nn.Module):
    def __init__(self, config: FeatureHeadConfig) -> None:
        super().__init__()
        self.config = c = config
        H, D = c.hidden, c.head_dim
        self.fc = nn.Linear((3 if c.prev_token else 2) * H, H)
        self.norm_in = nn.Parameter(torch.ones(H))
        self.qkv = nn.Linear(H, (c.heads + 2 * c.kv_heads) * D, bias=False)
        self.o = nn.Linear(c.heads * D, H, bias=False)
        self.norm_post = nn.Parameter(torch.ones(H))
        self.gate_up = nn.Linear(H, 2 * c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, H, bias=False)
        # borrowed from the verifier, not saved: its embedding and its output rows for the draft vocabulary
        self.register_buffer("vocab_ids", torch.zeros(c.draft_vocab, dtype=torch.long), persistent=True)
        self.embed: torch.Tensor | None = None  # [V, H]
        self.draft_rows: torch.Tensor | None = None  # [Vd, H]
        object.__setattr__(self, "verifier", None)
        self.kernels: dict = {}  # layer name -> kernels/dense_cpu.py's kernel (inference on AVX2 CPUs; use_kernels)
        self.layer_kernel = None  # kernels/head_layer.py's whole layer for a few rows (use_kernels)

    def attach(self, embed_weight: torch.Tensor, head_weight: torch.Tensor, dtype=None, verifier=None) -> None:
        """Borrow the verifier's embedding [V, H] and its output layer's rows for vocab_ids ([Vd, H]);
        `verifier` (kept outside the module's parameters) is what evaluation reads features from."""
        object.__setattr__(self, "verifier", verifier)
        dtype = dtype or self.fc.weight.dtype
        self.embed = embed_weight.detach().to(dtype)
        self.draft_rows = head_weight.detach()[self.vocab_ids].to(dtype)

    def use_kernels(self) -> bool:
        """Run inference through kernels/dense_cpu.py where it serves this CPU: fp32 weights on AVX2
        without AVX512-BF16 (dense), bf16 weights on AVX512-BF16 (bf16_dot): about 2x faster drafting
        there; the draft rows from an int8 copy (Int8Kernel: AVX512-VNNI or AVX2); the whole layer for a
        drafting level's few rows in one C call (layer_kernel, kernels/head_layer.py). Training never
        calls this. True if it does."""
        kernels = {name: drafter_kernel(getattr(self, name).weight, getattr(self, name).bias) for name in LINEARS}
        kernels["draft"] = drafter_kernel(self.draft_rows)
        if any(k is None for k in kernels.values()):
            return False
        self.kernels = kernels
        self.layer_kernel = self.make_layer_kernel()
        return True

    def make_layer_kernel(self):
        """kernels/head_layer.py's HeadLayer over this head's weights, or None where it does not serve."""
        c = self.config
        weights = {"fc_w": self.fc.weight, "fc_b": self.fc.bias, "norm_in": self.norm_in, "qkv_w": self.qkv.weight,
                   "o_w": self.o.weight, "norm_post": self.norm_post, "gu_w": self.gate_up.weight, "down_w": self.down.weight}
        return head_layer(weights, self.embed, c.heads, c.kv_heads, c.head_dim, c.rope_theta, c.rms_eps)

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        kernel = self.kernels.get(name)
        return kernel(x).to(x.dtype) if kernel is not None else getattr(self, name)(x)

    def layer(self, u: torch.Tensor, positions: torch.Tensor, past: tuple | None, mask) -> tuple[torch.Tensor, tuple]:
        """u [B, T, H] -> (f^ [B, T, H], (keys, values) [B, Hkv, S, D] with the past first)."""
        c = self.config
        B, T, _ = u.shape
        Hq, Hkv, D = c.heads, c.kv_heads, c.head_dim
        x = rms_norm(u, (self.norm_in, c.rms_eps))
        q, k, v = self.linear("qkv", x).view(B, T, Hq + 2 * Hkv, D).transpose(1, 2).split([Hq, Hkv, Hkv], dim=1)
        cos, sin = rope(positions, D, c.rope_theta, u.dtype)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if mask is None and T > 1:
            S = k.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool, device=u.device).tril_(S - T)[None, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # [B, Hq, T, D]
        h = u + self.linear("o", out.transpose(1, 2).reshape(B, T, Hq * D))
        gate, up = self.linear("gate_up", rms_norm(h, (self.norm_post, c.rms_eps))).chunk(2, dim=-1)
        return h + self.linear("down", F.silu(gate) * up), (k, v)

    def prev_inputs(self, prev_features: torch.Tensor, before: torch.Tensor | None) -> torch.Tensor:
        """What the input holds beside e(x_t): f_{t-1} [..., H], with e(x_{t-1}) after it for a prev_token
        head ([..., 2H]; before: the previous tokens [...])."""
        prev_features = prev_features.to(self.fc.weight.dtype)
        if not self.config.prev_token:
            return prev_features
        if before is None:
            raise ValueError("a prev_token head needs the tokens before its inputs")
        return torch.cat([prev_features, self.embed[before].to(prev_features.dtype)], dim=-1)

    def forward(self, tokens: torch.Tensor, prev_features: torch.Tensor, positions: torch.Tensor,
                past: tuple | None = None, mask=None, before: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple]:
        """tokens [B, T] (x_t), prev_features [B, T, H] (f_{t-1}), positions [B, T], before [B, T] (x_{t-1}:
        prev_token heads only) -> (f^_t [B, T, H], cache)."""
        u = self.linear("fc", torch.cat([self.embed[tokens], self.prev_inputs(prev_features, before)], dim=-1))
        return self.layer(u, positions, past, mask)

    def with_prev_token(self) -> "FeatureHead":
        """This head with the previous token's embedding added to its input, its outputs unchanged until
        trained (the new columns of W_fc start at zero)."""
        if self.config.prev_token:
            return self
        H = self.config.hidden
        wider = FeatureHead(replace(self.config, prev_token=True)).to(self.fc.weight.dtype)
        state = self.state_dict()
        state["fc.weight"] = torch.cat([state["fc.weight"], torch.zeros(H, H, dtype=state["fc.weight"].dtype)], dim=1)
        wider.load_state_dict(state)
        if self.embed is not None:
            wider.embed, wider.draft_rows = self.embed, self.draft_rows
            object.__setattr__(wider, "verifier", self.verifier)
        return wider

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """f^ [..., H] -> logits over the draft vocabulary [..., Vd] (index with vocab_ids for token ids)."""
        if "draft" in self.kernels:
            return self.kernels["draft"](features)
        return features @ self.draft_rows.T

    # ------------------------------------------------------------------ files
    def save(self, folder: Path, info: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v).cpu() for k, v in self.state_dict().items()}
        (folder / CONFIG_FILE).write_text(json.dumps({"feature_head": asdict(self.config), **(info or {})}, indent=1))
        save_file(state, str(folder / WEIGHTS_FILE))

    @classmethod
    def load(cls, folder: Path, dtype=torch.float32) -> "FeatureHead":
        from safetensors.torch import load_file

        folder = Path(folder)
        config = FeatureHeadConfig(**json.loads((folder / CONFIG_FILE).read_text())["feature_head"])
        head = cls(config)
        head.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
        return head.to(dtype).eval()


def is_feature_head(folder: Path) -> bool:
    return (Path(folder) / CONFIG_FILE).exists()
