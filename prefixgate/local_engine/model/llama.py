"""Llama-family decoder forward in plain torch, reading and writing K/V in the shared KV pool.

Covers the configs of Llama 2/3 (incl. ``rope_type: llama3`` scaling), SmolLM2 (tied
embeddings), Qwen2/2.5 (q/k/v bias) and Mistral (no sliding window: contexts are assumed to fit
the window). Weights are loaded through transformers (``AutoModelForCausalLM.from_pretrained`` of
an HF safetensors directory, or of a GGUF file via ``gguf_file=``) and copied into fused modules
(q|k|v as one matrix, gate|up as one matrix) so a layer is six matmuls.

A forward step runs on a *packed ragged batch*: ``T`` new tokens of ``B`` sequences laid end to end
(``[T]`` ids and positions; positions continue from each sequence's cached length). Attention reads
each sequence's keys/values from the pool by slot index, see ``attention.AttnGroup``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from prefixgate.local_engine.kv.pool import KVPool
from prefixgate.local_engine.model.attention import AttnMeta, attend


@dataclass(frozen=True)
class ModelArgs:
    """The architecture numbers of a Llama-family checkpoint (read from its HF config)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    rope_theta: float
    rope_scaling: dict[str, Any] | None

    @staticmethod
    def from_hf_config(cfg: Any) -> ModelArgs:
        """Build from a transformers ``PretrainedConfig`` (Llama, Qwen2, Mistral model types).

        Raises ``ValueError`` for a model type this forward does not implement.
        """
        mtype = getattr(cfg, "model_type", "llama")
        if mtype not in ("llama", "qwen2", "mistral"):
            raise ValueError(f"unsupported model_type {mtype!r} (llama, qwen2, mistral)")
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        rope = dict(getattr(cfg, "rope_parameters", None) or {})
        legacy = getattr(cfg, "rope_scaling", None)
        if legacy and not rope.get("rope_type"):
            rope.update(legacy)
        theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        rtype = rope.get("rope_type", rope.get("type", "default")) or "default"
        qkv_bias = bool(getattr(cfg, "attention_bias", False)) or mtype == "qwen2"
        return ModelArgs(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=float(cfg.rms_norm_eps),
            max_position_embeddings=int(cfg.max_position_embeddings),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            rope_theta=theta,
            rope_scaling=None if rtype == "default" else {**rope, "rope_type": rtype},
        )


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse RoPE frequencies ``[head_dim/2]`` fp32, with ``linear`` / ``llama3`` scaling.

    Source: RoFormer (Su et al. 2021); Llama 3.1's frequency-dependent scaling (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``) as in Meta's
    reference ``apply_scaling`` and transformers' ``_compute_llama3_parameters``.
    Raises ``ValueError`` for other scaling types (yarn, dynamic, ...).
    """
    dim = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    sc = args.rope_scaling
    if sc is None:
        return inv
    rtype = sc["rope_type"]
    if rtype == "linear":
        return inv / float(sc["factor"])
    if rtype != "llama3":
        raise ValueError(f"unsupported rope_type {rtype!r} (default, linear, llama3)")
    factor, low, high = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old_ctx = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(args: ModelArgs, max_pos: int, dtype: torch.dtype, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and *signed* sin tables ``[max_pos, head_dim]`` (halves duplicated, HF layout).

    The sin table's first half is negated (see ``apply_rope``).
    """
    inv = rope_inv_freq(args)
    freqs = torch.arange(max_pos, dtype=torch.int64).float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    return cos.to(device), rope_tables_signed(sin).to(device)


def rope_tables_signed(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated, so that ``rotate_half(x) * sin ==
    roll(x, half) * signed_sin`` exactly (a sign flip is exact in IEEE arithmetic)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` by ``cos / signed_sin [T, 1, head_dim]``.

    Equals HF's ``x * cos + rotate_half(x) * sin`` bit for bit, in four ops.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019) in fp32, as transformers' ``LlamaRMSNorm``."""
    if x.dtype == torch.float32:  # skip no-op casts: each op costs dispatch time at batch 1
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    """Holds an RMSNorm ``weight [hidden]``; the math is ``rms_norm``."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]`` -> normalized ``[T, hidden]``."""
        return rms_norm(x, self.weight, self.eps)


class DecoderLayer(nn.Module):
    """One pre-norm block: RMSNorm → GQA attention over the pool → RMSNorm → SwiGLU MLP."""

    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        h, d = args.hidden_size, args.head_dim
        self.layer_id = layer_id
        self.nh, self.nkv, self.hd = args.num_heads, args.num_kv_heads, d
        self.q_size, self.kv_size = self.nh * d, self.nkv * d
        self.input_norm = RMSNorm(h, args.rms_norm_eps)
        self.post_attn_norm = RMSNorm(h, args.rms_norm_eps)
        self.qkv = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=args.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * args.intermediate_size, bias=False)
        self.down = nn.Linear(args.intermediate_size, h, bias=False)
        self.inter = args.intermediate_size
        self.requires_grad_(False)

    def bind(self) -> None:
        """Cache the weights as plain attributes (nn.Module attribute lookup is slow Python).

        Call after loading / moving the weights; ``forward`` reads only these.
        """
        self._w = (self.input_norm.weight, self.qkv.weight, self.qkv.bias, self.o_proj.weight,
                   self.post_attn_norm.weight, self.gate_up.weight, self.down.weight)
        self._split = [self.inter, self.inter]
        self._eps = self.input_norm.eps
        self._mm: Callable[..., torch.Tensor] = F.linear  # quant.linear_any when quantized

    def forward(self, x: torch.Tensor, meta: AttnMeta, pool: KVPool) -> torch.Tensor:
        """``x [T, hidden]`` → ``[T, hidden]``; writes this layer's new K/V at ``meta.out_slots``.

        Called as a plain method (not ``module(...)``): per-step Python overhead matters at
        batch 1, where a step is ~30 layers of small ops around memory-bound matmuls.
        """
        w_in, w_qkv, b_qkv, w_o, w_post, w_gu, w_down = self._w
        t, nh, nkv, d, eps = x.shape[0], self.nh, self.nkv, self.hd, self._eps
        mm = self._mm
        qkv = mm(rms_norm(x, w_in, eps), w_qkv, b_qkv)
        qk = apply_rope(qkv[:, : self.q_size + self.kv_size].view(t, nh + nkv, d),
                        meta.cos, meta.sin)
        li = self.layer_id
        pool.write(li, meta.out_slots, qk[:, nh:], qkv[:, self.q_size + self.kv_size:].view(t, nkv, d))
        x = x + mm(attend(qk[:, :nh], pool.k[li], pool.v[li], meta), w_o)
        gate, up = mm(rms_norm(x, w_post, eps), w_gu).split_with_sizes(self._split, dim=-1)
        return x + mm(F.silu(gate) * up, w_down)


class CausalLM(nn.Module):
    """The whole decoder: embeddings, layers, final norm, LM head (tied or not).

    ``forward(ids [T], meta, pool, logit_rows [R]) -> logits [R, vocab]`` (fp32): only the rows
    that are sampled from get an LM head, which saves ``vocab × hidden`` work per other token.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = None if args.tie_word_embeddings else nn.Linear(
            args.hidden_size, args.vocab_size, bias=False)
        self.requires_grad_(False)
        self._layers = self.decoder_layers()
        self._head: Callable[[torch.Tensor], torch.Tensor] | None = None  # set by quant
        # per-row argmax only (screened_head.ScreenedHead; set by cpu_linear / quant on CPU)
        self._argmax_head: Callable[[torch.Tensor], torch.Tensor] | None = None

    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers, typed (``nn.ModuleList`` iterates as plain ``Module``)."""
        return [cast(DecoderLayer, m) for m in self.layers]

    def head_weight(self) -> torch.Tensor:
        """``[vocab, hidden]`` matrix of the LM head (the embedding when tied)."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, ids: torch.Tensor, meta: AttnMeta, pool: KVPool,
                logit_rows: torch.Tensor, argmax_only: bool = False) -> torch.Tensor:
        """``ids [T]`` -> logits ``[R, vocab]`` fp32 for ``logit_rows [R]``; writes K/V to
        ``pool``. ``argmax_only``: the caller reads only each row's argmax (greedy, no logit
        changes); a model with an argmax head (``screened_head``) then returns rows whose
        argmax is the full head's but whose other entries are estimates."""
        x = F.embedding(ids, self.embed.weight)
        for layer in self._layers:
            x = layer.forward(x, meta, pool)
        x = rms_norm(x.index_select(0, logit_rows), self.norm.weight, self.norm.eps)
        if argmax_only and self._argmax_head is not None:
            return self._argmax_head(x)
        if self._head is not None:
            return self._head(x).float()
        return F.linear(x, self.head_weight()).float()


def split_model_path(model_path: str) -> tuple[str, str | None]:
    """``DIR`` → ``(DIR, None)``; ``DIR/x.gguf`` → ``(DIR, "x.gguf")`` (transformers' gguf_file)."""
    p = Path(model_path).expanduser()
    if p.suffix == ".gguf":
        return str(p.parent), p.name
    return str(p), None


def load_model(model_path: str, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """Load an HF checkpoint (safetensors dir or GGUF file) and copy it into a ``CausalLM``.

    Raises ``ValueError`` for an unsupported architecture, ``OSError`` when the path holds no model.
    """
    from transformers import AutoModelForCausalLM

    d, gguf = split_model_path(model_path)
    kw: dict[str, Any] = {"dtype": torch.float32}
    if gguf:
        kw["gguf_file"] = gguf
    hf = AutoModelForCausalLM.from_pretrained(d, **kw)
    args = ModelArgs.from_hf_config(hf.config)
    sd = hf.state_dict()
    model = CausalLM(args)
    with torch.no_grad():
        model.embed.weight.copy_(sd["model.embed_tokens.weight"])
        model.norm.weight.copy_(sd["model.norm.weight"])
        if model.lm_head is not None:
            model.lm_head.weight.copy_(sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))
        for i, layer in enumerate(model.decoder_layers()):
            p = f"model.layers.{i}."
            layer.input_norm.weight.copy_(sd[p + "input_layernorm.weight"])
            layer.post_attn_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
            layer.qkv.weight.copy_(torch.cat(
                [sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], dim=0))
            if layer.qkv.bias is not None:
                layer.qkv.bias.copy_(torch.cat(
                    [sd.get(p + f"self_attn.{n}_proj.bias", torch.zeros(
                        sd[p + f"self_attn.{n}_proj.weight"].shape[0])) for n in "qkv"], dim=0))
            layer.o_proj.weight.copy_(sd[p + "self_attn.o_proj.weight"])
            layer.gate_up.weight.copy_(torch.cat(
                [sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]], dim=0))
            layer.down.weight.copy_(sd[p + "mlp.down_proj.weight"])
    del hf, sd
    model = model.to(device=device, dtype=dtype).eval()
    for layer in model.decoder_layers():
        layer.bind()
    return model
