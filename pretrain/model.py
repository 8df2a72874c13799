"""SmolLM3-architecture models built from a typed shape (GQA, NoPE layers, tied embeddings).

    >>> shape = ModelShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    >>> model = build_model(shape, vocab_size=300)
    >>> model.config.model_type, model.config.tie_word_embeddings
    ('smollm3', True)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from smolforge.recipe import FRACTION


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
