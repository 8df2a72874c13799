"""Pack tokenized documents into fixed-length rows with per-document position ids.

Rows are padding-free: documents are concatenated and cut at ``seq_len``. ``position_ids``
restart at 0 at every document start, which makes transformers build a per-document causal mask
(no token attends across documents) when ``attention_mask`` is None and ``use_cache=False``.
The first token of each document gets label -100: it would otherwise be predicted from the
previous document.

    >>> rows = pack_documents([[5, 6, 0], [7, 8, 9, 0]], seq_len=4)
    >>> rows[0]
    {'input_ids': [5, 6, 0, 7], 'position_ids': [0, 1, 2, 0], 'labels': [-100, 6, 0, -100]}
"""
from __future__ import annotations

IGNORE_INDEX = -100


def pack_documents(documents: list[list[int]], seq_len: int, drop_last: bool = True,
                   pad_id: int | None = None) -> list[dict]:
    """Concatenate ``documents`` (token id lists, each ending with its separator) into rows.

    With ``pad_id``, a document that fits in a row is never cut: when it does not fit in what is
    left of the current row, the row is closed with ``pad_id`` tokens (each at position 0, label
    -100, so nothing attends to or learns from them) and the document starts the next row. Long-
    context training needs this: a cut document's second half cannot see its first.

    >>> pack_documents([[5, 6, 0], [7, 8, 9, 0]], seq_len=4, pad_id=1)[0]
    {'input_ids': [5, 6, 0, 1], 'position_ids': [0, 1, 2, 0], 'labels': [-100, 6, 0, -100]}
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    rows: list[dict] = []
    ids: list[int] = []
    pos: list[int] = []
    labels: list[int] = []
    for doc in documents:
        if pad_id is not None and ids and len(doc) <= seq_len and len(ids) + len(doc) > seq_len:
            gap = seq_len - len(ids)
            rows.append({"input_ids": ids + [pad_id] * gap, "position_ids": pos + [0] * gap,
                         "labels": labels + [IGNORE_INDEX] * gap})
            ids, pos, labels = [], [], []
        start = 0
        while start < len(doc):
            take = min(len(doc) - start, seq_len - len(ids))
            piece = doc[start:start + take]
            ids += piece
            pos += list(range(len(piece)))
            labels += [IGNORE_INDEX] + piece[1:]
            start += take
            if len(ids) == seq_len:
                rows.append({"input_ids": ids, "position_ids": pos, "labels": labels})
                ids, pos, labels = [], [], []
    if ids and not drop_last:
        rows.append({"input_ids": ids, "position_ids": pos, "labels": labels})
    return rows


def packing_efficiency(rows: list[dict], seq_len: int) -> float:
    """Share of row slots that hold real tokens (1.0 for full padding-free rows)."""
    if not rows:
        return 0.0
    return sum(len(r["input_ids"]) for r in rows) / (len(rows) * seq_len)
