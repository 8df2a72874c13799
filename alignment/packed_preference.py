"""Packed preference batches: every sequence of a DPO batch in ONE row, document-masked, no padding.

TRL's DPOTrainer pads a batch's 2·B sequences (each pair's prompt+chosen and prompt+rejected) to the
longest one; with answers of uneven length most of the batch is padding (TRL 1.16 disabled its DPO
``padding_free``). Here the model's forward is wrapped so that a batch arrives as TRL builds it
and leaves as TRL expects it, but runs as one row in between:

1. each sequence's real tokens (its ``attention_mask``) are concatenated, chosen and rejected as separate
   documents, with ``position_ids`` restarting at 0 at each: transformers then keeps every document
   apart (a per-document causal mask for sdpa/eager; varlen ``cu_seqlens`` for flash-attention);
2. the labels are shifted per document (``shift_labels``; a document's last token predicts nothing, so
   nothing is predicted across a boundary) and TRL's fused LM head scores them;
3. the per-token log-probs are cut back into the ``[2·B, T − 1]`` layout, zero where TRL's labels are
   -100, so TRL's own sums per sequence, its losses and its metrics run unchanged.

The loss equals the padded one to float rounding (tests/test_dpo_family.py: within 1e-5 on this
CPU); ``bench/packed_dpo.py`` measures the padding removed and the tokens/s.

    >>> import torch
    >>> ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    >>> mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    >>> labels = torch.tensor([[-100, 6, 7, -100], [-100, 9, -100, -100]])
    >>> packed = pack(ids, mask, labels)
    >>> packed.input_ids.tolist(), packed.position_ids.tolist(), packed.shift_labels.tolist()
    ([[5, 6, 7, 8, 9]], [[0, 1, 2, 0, 1]], [[6, 7, -100, 9, -100]])
    >>> unpack(torch.tensor([[1.5, 2.5, 0.0, 4.5, 0.0]]), packed.lengths, width=3).tolist()
    [[1.5, 2.5, 0.0], [4.5, 0.0, 0.0]]
"""
from __future__ import annotations

import types
from typing import Any, NamedTuple

__all__ = ["Packed", "pack", "unpack", "add_packed_forward", "padding_waste"]

IGNORE = -100


class Packed(NamedTuple):
    input_ids: Any        # [1, S]: the real tokens of every sequence, one after the other
    position_ids: Any     # [1, S]: 0, 1, … restarting at each sequence
    shift_labels: Any     # [1, S]: the next token of the same sequence where it is scored, else -100
    lengths: list[int]    # each sequence's real length


def pack(input_ids: Any, attention_mask: Any, labels: Any) -> Packed:
    """A right-padded ``[N, T]`` batch (TRL's DPO collator's layout) as one packed row."""
    import torch

    lengths = [int(n) for n in attention_mask.sum(dim=1).tolist()]
    pieces, positions, targets = [], [], []
    for row, n in enumerate(lengths):
        pieces.append(input_ids[row, :n])
        positions.append(torch.arange(n, device=input_ids.device))
        nxt = labels[row, 1:n]
        targets.append(torch.cat([nxt, nxt.new_full((1,), IGNORE)]) if n else nxt)
    return Packed(torch.cat(pieces)[None], torch.cat(positions)[None], torch.cat(targets)[None], lengths)


def unpack(values: Any, lengths: list[int], width: int) -> Any:
    """``[1, S]`` per-token values of a packed row back to ``[N, width]`` (each sequence's first
    ``n − 1`` next-token values, zero after), keeping the gradient."""
    import torch
    import torch.nn.functional as F

    rows, offset = [], 0
    for n in lengths:
        scored = values[0, offset:offset + max(n - 1, 0)]
        rows.append(F.pad(scored, (0, width - scored.shape[0])))
        offset += n
    return torch.stack(rows)


def add_packed_forward(model: Any) -> None:
    """Wrap ``model``'s forward (after TRL's ``add_fused_lm_head``): a call with ``fused_lm_head=True``
    and a padded batch runs packed; anything else (generation, plain calls) is the forward as it was."""
    fused = model.forward

    def forward(self, *args, fused_lm_head: bool = False, input_ids=None, attention_mask=None, labels=None,
                **kwargs):
        if not fused_lm_head or input_ids is None or attention_mask is None or labels is None or args:
            return fused(*args, fused_lm_head=fused_lm_head, input_ids=input_ids, attention_mask=attention_mask,
                         labels=labels, **kwargs)
        from trl.trainer.utils import FusedCausalLMOutput

        packed = pack(input_ids, attention_mask, labels)
        kwargs.pop("position_ids", None)
        out = fused(input_ids=packed.input_ids, position_ids=packed.position_ids, shift_labels=packed.shift_labels,
                    fused_lm_head=True, **kwargs)
        width = input_ids.shape[1] - 1
        fields = {name: None if getattr(out, name, None) is None else unpack(getattr(out, name), packed.lengths, width)
                  for name in ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")}
        return FusedCausalLMOutput(loss=out.loss, aux_loss=getattr(out, "aux_loss", None), **fields)

    model.forward = types.MethodType(forward, model)


def padding_waste(lengths: list[int], batch_size: int) -> dict:
    """Padding of a run of sequences batched ``batch_size`` pairs (2 sequences each) at a time, padded
    to each batch's longest (TRL's collator) against packed (none):
    ``{"padded_slots", "real_tokens", "waste"}``.

    >>> padding_waste([3, 1, 2, 2], batch_size=1)     # pairs (3, 1) and (2, 2)
    {'padded_slots': 10, 'real_tokens': 8, 'waste': 0.2}
    """
    per_batch = 2 * batch_size
    slots = sum(len(lengths[i:i + per_batch]) * max(lengths[i:i + per_batch])
                for i in range(0, len(lengths), per_batch))
    real = sum(lengths)
    return {"padded_slots": slots, "real_tokens": real, "waste": round(1 - real / slots, 4) if slots else 0.0}
