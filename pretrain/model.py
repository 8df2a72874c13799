"""SmolLM3-architecture models built from a typed shape (GQA, NoPE layers, tied embeddings).

    >>> shape = ModelShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    >>> model = build_model(shape, vocab_size=300)
    >>> model.config.model_type, model.config.tie_word_embeddings
    ('smollm3', True)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from smolforge.attention import FLASH_PACKAGES, resolve_attention
from smolforge.recipe import FRACTION

log = logging.getLogger(__name__)


@dataclass
class ModelShape:
    hidden_size: int = 128            # width of the residual stream
    intermediate_size: int = 384      # MLP width
    num_layers: int = 4               # transformer blocks
    num_heads: int = 4                # attention heads (head_dim = hidden / heads; vLLM CPU needs >= 32)
    num_kv_heads: int = 2             # GQA key/value heads (SmolLM3: 4 groups)
    nope_every: int = 4               # every n-th layer drops RoPE (SmolLM3's hybrid positions); 0 = never
    max_position_embeddings: int = 2048  # longest sequence the model is built for
    rope_theta: float = 10000.0       # RoPE base
    tie_word_embeddings: bool = True  # share input and output embeddings (small-scale default)
    dropout: float = field(default=0.0, metadata=FRACTION)             # attention dropout
    extra: dict = field(default_factory=dict)  # any other SmolLM3Config keyword

    @classmethod
    def of(cls, config) -> "ModelShape":
        """The shape of a loaded model's config (a parent's, for continued pretraining).

        >>> ModelShape.of(model_config(ModelShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1), 300)).hidden_size
        64
        """
        rope = getattr(config, "rope_parameters", None) or {}
        layers = list(getattr(config, "no_rope_layers", None) or [])
        return cls(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                   num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
                   num_kv_heads=getattr(config, "num_key_value_heads", config.num_attention_heads),
                   nope_every=0 if not layers or all(layers) else layers.index(0) + 1,
                   max_position_embeddings=config.max_position_embeddings,
                   rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
                   tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)))


def no_rope_layers(num_layers: int, nope_every: int) -> list[int]:
    """SmolLM3's mask: 1 = RoPE, 0 = NoPE. Every ``nope_every``-th layer (1-based) is NoPE.

    With fewer layers than ``nope_every`` the last layer is NoPE, so tiny models exercise it too.
    """
    if nope_every <= 0:
        return [1] * num_layers
    mask = [0 if (i + 1) % nope_every == 0 else 1 for i in range(num_layers)]
    if 0 not in mask:
        mask[-1] = 0
    return mask


def model_config(shape: ModelShape, vocab_size: int, pad_token_id: int | None = None,
                 eos_token_id: int | None = None, bos_token_id: int | None = None):
    from transformers import SmolLM3Config

    if shape.hidden_size % shape.num_heads or shape.num_heads % shape.num_kv_heads:
        raise ValueError(f"hidden_size {shape.hidden_size} must divide by num_heads {shape.num_heads}, "
                         f"and num_heads by num_kv_heads {shape.num_kv_heads}")
    return SmolLM3Config(
        vocab_size=vocab_size, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        no_rope_layers=no_rope_layers(shape.num_layers, shape.nope_every),
        tie_word_embeddings=shape.tie_word_embeddings, attention_dropout=shape.dropout,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
        use_cache=True, **shape.extra)


def build_model(shape: ModelShape, vocab_size: int, seed: int = 0, **token_ids):
    """A freshly initialised ``SmolLM3ForCausalLM`` in fp32."""
    import torch
    from transformers import SmolLM3ForCausalLM

    torch.manual_seed(seed)
    return SmolLM3ForCausalLM(model_config(shape, vocab_size, **token_ids))


def count_parameters(shape: ModelShape, vocab_size: int) -> int:
    """Parameters of the shape, counted on the meta device (no memory used)."""
    import torch
    from transformers import SmolLM3ForCausalLM

    with torch.device("meta"):
        model = SmolLM3ForCausalLM(model_config(shape, vocab_size))
    return sum(p.numel() for p in model.parameters())


def use_attention(model, requested: str, *, half_precision: bool,
                  field: str = "train.attn_implementation") -> str:
    """Switch ``model`` to the attention implementation ``requested`` resolves to for packed rows on
    this machine (:func:`smolforge.attention.resolve_attention`); returns the one the model now runs.

    >>> model = build_model(ModelShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1), 300)
    >>> use_attention(model, "eager", half_precision=False), model.config._attn_implementation
    ('eager', 'eager')
    """
    dropout = float(getattr(model.config, "attention_dropout", 0.0) or 0.0)
    chosen = resolve_attention(requested, packed=True, half_precision=half_precision, dropout=dropout, field=field)
    if requested == "auto":
        log.info("%s: auto → %s", field, chosen)
    model.set_attn_implementation(chosen)
    return model.config._attn_implementation  # what runs (a model class that cannot switch keeps its own)


def varlen_kwargs(position_ids, implementation: str) -> dict:
    """Flash attention's varlen arguments for a batch of packed rows; ``{}`` for other implementations.

    transformers derives ``cu_seqlens`` from ``position_ids`` by itself only for a batch of ONE row;
    with several rows flash attention would treat each row as one sequence, its documents attending
    to each other. Every packed row starts a document at position 0, so the batch read as one long
    row holds the same documents: transformers' own ``prepare_fa_kwargs_from_position_ids`` gives
    their boundaries (computed once per batch, on the host, as TRL's padding-free collator does).

    >>> import torch
    >>> kwargs = varlen_kwargs(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]), "flash_attention_2")
    >>> kwargs["cu_seq_lens_q"].tolist(), kwargs["max_length_q"]
    ([0, 3, 5, 7, 10], 3)
    >>> varlen_kwargs(torch.tensor([[0, 1, 0]]), "sdpa")
    {}
    """
    if implementation not in FLASH_PACKAGES:
        return {}
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(position_ids)
    return {"cu_seq_lens_q": cu_q, "cu_seq_lens_k": cu_k, "max_length_q": int(max_q), "max_length_k": int(max_k)}
