"""Per-document scoring for the preference task (loaded by lm-eval through ``!function``)."""


def preference_results(doc: dict, results: list) -> dict:
    """``results`` holds one ``(loglikelihood, is_greedy)`` per choice; choice ``gold`` is preferred."""
    logliks = [ll for ll, _ in results]
    gold = int(doc["gold"])
    best_other = max(ll for i, ll in enumerate(logliks) if i != gold)
    return {"acc": float(logliks[gold] > best_other), "margin": logliks[gold] - best_other}
