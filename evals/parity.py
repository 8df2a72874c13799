"""Do two backends give the same scores? Per task, per metric and per document.

    >>> a = {"backend": "hf", "scores": {"t": {"acc": 0.5, "margin": 2.0}},
    ...      "samples": [{"task": "t", "doc_id": 0, "resps": [[-1.25, True]]}]}
    >>> b = {"backend": "endpoint", "scores": {"t": {"acc": 0.5, "margin": 2.0000004}},
    ...      "samples": [{"task": "t", "doc_id": 0, "resps": [[-1.2500003, True]]}]}
    >>> report = compare(a, b)
    >>> report["agree"], report["tasks"]["t"]["documents_differing"]
    (True, 0)

Both sides score in the same dtype (:func:`smolforge.evals.backends.scoring_dtype`) and the
tolerances follow it (:func:`tolerance`); the report records ``dtype`` and ``tolerance``. In fp32:

- *Documents*: generated text must be identical (greedy decoding of the same weights in fp32
  picks the same token unless two logits tie within rounding); log-likelihoods may differ by
  ``LOGLIK_ATOL`` = 1e-3 per sequence. vLLM's CPU attention and HF's SDPA sum in different
  orders: the per-token log-prob difference measured on the demo model is ≤ 1.2e-6 (docs/stack.md),
  so a 100-token continuation stays below 1e-3 with room to spare; ``is_greedy`` flags must match.
- *Metrics*: counts of correct documents (acc, exact_match, any metric whose values are k/n)
  must be identical, since one flipped document is a real difference of 1/n; continuous
  metrics (e.g. a log-prob margin) may differ by ``METRIC_RTOL`` = 1e-4 relative (1e-4 absolute
  near zero).

In bf16 and fp16 (a GPU scoring a bf16/fp16 checkpoint as it is served) every layer rounds its output
to 8 (bf16) or 11 (fp16) bits of mantissa and the two backends' kernels round in different places:
per-token log-prob differences of ≈1e-2 (bf16) are normal, so a sequence may differ by 0.25 (bf16)
or 0.05 (fp16) and continuous metrics by 2e-2 (bf16) or 5e-3 (fp16) relative. Counts of correct
documents must still be identical: a flipped document is reported (near-ties can flip in bf16).

    >>> tolerance("float32")["loglik_atol"] < tolerance("float16")["loglik_atol"] < tolerance("bfloat16")["loglik_atol"]
    True
"""
from __future__ import annotations

import math
from typing import Any

LOGLIK_ATOL = 1e-3
METRIC_RTOL = 1e-4
# (loglik_atol per sequence, metric_rtol) by the dtype both sides score in (module docstring)
TOLERANCES = {"float32": (LOGLIK_ATOL, METRIC_RTOL), "float16": (5e-2, 5e-3), "bfloat16": (2.5e-1, 2e-2)}
_COUNT_METRICS = ("acc", "acc_norm", "exact_match", "em", "f1_exact")


def _close(a: float, b: float, rtol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=rtol)


def same_response(a: Any, b: Any, loglik_atol: float = LOGLIK_ATOL) -> bool:
    """Whether two lm-eval filtered responses agree (strings exact, floats within ``loglik_atol``).

    >>> same_response([[-2.0, False], [-0.5, True]], [[-2.0004, False], [-0.5, True]])
    True
    >>> same_response(["Bo eats rice."], ["Bo eats corn."])
    False
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= loglik_atol
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_response(x, y, loglik_atol) for x, y in zip(a, b))
    return a == b


def largest_loglik_gap(a: Any, b: Any) -> float:
    """The largest absolute difference between the log-likelihoods of two responses (0.0 for text).

    >>> largest_loglik_gap([[-2.0, False], [-0.5, True]], [[-2.0004, False], [-0.5, True]]) < 5e-4
    True
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return 0.0
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return max((largest_loglik_gap(x, y) for x, y in zip(a, b)), default=0.0)
    return 0.0


def tolerance(dtype: str | None) -> dict:
    """How far two scorings in ``dtype`` may differ (an unknown dtype, e.g. an endpoint's: fp32's).

    >>> tolerance("bfloat16")
    {'loglik_atol': 0.25, 'metric_rtol': 0.02, 'count_metrics': 'identical'}
    """
    loglik_atol, metric_rtol = TOLERANCES.get(dtype or "float32", TOLERANCES["float32"])
    return {"loglik_atol": loglik_atol, "metric_rtol": metric_rtol, "count_metrics": "identical"}


def common_dtype(*dtypes: str | None) -> str | None:
    """The least precise of the dtypes two scorings ran in (None: unknown, e.g. an external endpoint's).

    >>> common_dtype("float32", "bfloat16"), common_dtype("float32", None), common_dtype(None, None)
    ('bfloat16', 'float32', None)
    """
    known = [d for d in dtypes if d is not None]
    return max(known, key=lambda d: TOLERANCES.get(d, TOLERANCES["float32"])[0]) if known else None


def compare(first: dict, second: dict, *, loglik_atol: float | None = None, metric_rtol: float | None = None) -> dict:
    """Per-task metric differences and differing documents of two scorings (``{backend, scores, samples}``
    and ``dtype`` where known); tolerances follow the dtype (:func:`tolerance`) unless given."""
    dtype = common_dtype(first.get("dtype"), second.get("dtype"))
    limits = tolerance(dtype)
    loglik_atol = limits["loglik_atol"] if loglik_atol is None else loglik_atol
    metric_rtol = limits["metric_rtol"] if metric_rtol is None else metric_rtol
    docs_a = {(s["task"], s["doc_id"]): s for s in first["samples"]}
    docs_b = {(s["task"], s["doc_id"]): s for s in second["samples"]}
    tasks: dict[str, dict] = {}
    for task in sorted(set(first["scores"]) | set(second["scores"])):
        scores_a, scores_b = first["scores"].get(task, {}), second["scores"].get(task, {})
        metrics = {}
        for metric in sorted(k for k in set(scores_a) | set(scores_b) if not k.endswith("_stderr")):
            a, b = scores_a.get(metric), scores_b.get(metric)
            if a is None or b is None:
                metrics[metric] = {"first": a, "second": b, "diff": None, "ok": False}
                continue
            exact = metric in _COUNT_METRICS
            ok = a == b if exact else _close(a, b, metric_rtol)
            metrics[metric] = {"first": a, "second": b, "diff": b - a, "ok": ok,
                               "rule": "identical" if exact else f"rel {metric_rtol:g}"}
        keys = sorted(k for k in set(docs_a) | set(docs_b) if k[0] == task)
        differing = [doc_id for (_, doc_id) in keys
                     if (_, doc_id) not in docs_a or (_, doc_id) not in docs_b
                     or not same_response(docs_a[(task, doc_id)]["resps"], docs_b[(task, doc_id)]["resps"],
                                          loglik_atol)]
        both = [k for k in keys if k in docs_a and k in docs_b]
        gap = max((largest_loglik_gap(docs_a[k]["resps"], docs_b[k]["resps"]) for k in both), default=0.0)
        tasks[task] = {"metrics": metrics, "documents": len(keys), "documents_differing": len(differing),
                       "differing_doc_ids": differing[:20], "max_loglik_diff": gap,
                       "ok": all(m["ok"] for m in metrics.values()) and not differing}
    return {"first": first["backend"], "second": second["backend"], "agree": all(t["ok"] for t in tasks.values()),
            "dtype": dtype, "tolerance": {**limits, "loglik_atol": loglik_atol, "metric_rtol": metric_rtol},
            "tasks": tasks}


def parity_rows(report: dict) -> list[list[str]]:
    """Table rows: task, metric, first, second, difference, documents differing, verdict.

    >>> parity_rows({"tasks": {"t": {"metrics": {"acc": {"first": 0.5, "second": 0.5, "diff": 0.0, "ok": True}},
    ...              "documents": 4, "documents_differing": 0, "ok": True}}})
    [['t', 'acc', '0.500000', '0.500000', '+0.0e+00', '0/4', 'ok']]
    """
    rows = []
    for task, info in report["tasks"].items():
        for metric, m in info["metrics"].items():
            show = (lambda v: "-" if v is None else f"{v:.6f}")
            rows.append([task, metric, show(m["first"]), show(m["second"]),
                         "-" if m["diff"] is None else f"{m['diff']:+.1e}",
                         f"{info['documents_differing']}/{info['documents']}", "ok" if m["ok"] else "DIFFERS"])
    return rows
