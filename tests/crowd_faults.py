"""A crowd of annotators submitting while a fault happens, for the fault tests (test_annotate_faults,
test_annotate_loop): push a dataset of ``records`` two-response records, let ``annotators`` scripted
users submit through the UI's call (:mod:`smolforge.annotate.crowd`), run ``fault()`` once a third of
the answers are acknowledged, then read every response back.
"""
from __future__ import annotations

import threading

from smolforge.annotate.records import build_record, review_schema
from smolforge.annotate.server import connect


def answer(username: str, record: dict) -> tuple[str, str]:
    """The response that states the right product."""
    numbers = [int(text.split()[2].rstrip(".")) for text in record["responses"]]
    return f"response_{1 + [n % 5 for n in numbers].index(0)}", "submitted"


def crowd_under_fault(url: str, api_key: str, dataset: str, fault, *, annotators: int = 4,
                      records: int = 12) -> tuple[dict, dict]:
    """``(what the clients saw, what the server holds)``: :meth:`CrowdLog.summary` and :func:`audit`."""
    from smolforge.annotate.crowd import audit, submit_concurrently
    from smolforge.annotate.push import push_records
    from smolforge.annotate.scripted import records_to_answer, scripted_users

    items = [build_record(f"What is {i} times 5?", [f"It is {5 * i}.", f"It is {5 * i + 2}."], ["run-a", "run-b"],
                          {"temperature": 0.7}) for i in range(records)]
    push_records(connect(url, api_key), dataset, "argilla",
                 review_schema(2, sampling={"temperature": 0.7}, min_submitted=2), items)
    to_answer = records_to_answer(url, api_key, dataset, "argilla")
    users = scripted_users(url, api_key, "argilla", annotators)
    third = threading.Event()
    result = {}
    crowd = threading.Thread(target=lambda: result.update(log=submit_concurrently(
        url, users, to_answer, answer, deadline_s=240, retry_wait_s=0.3, timeout_s=20,
        on_acknowledged=lambda n: n >= annotators * records // 3 and third.set())))
    crowd.start()
    try:
        assert third.wait(timeout=120), "the crowd never got a third of its answers in"
        fault()
    finally:
        crowd.join(timeout=300)
    assert not crowd.is_alive()
    log = result["log"]
    return log.summary(), audit(url, api_key, dataset, "argilla", log)


def assert_nothing_lost(summary: dict, checked: dict, planned: int, errors_seen: bool) -> None:
    """Every acknowledged answer stored with its value, none twice, every planned one in; and the
    outage reached the clients as errors when ``errors_seen``."""
    assert checked["lost"] == 0 and checked["duplicated"] == 0, checked
    assert summary["unfinished"] == 0 and checked["stored"] == summary["planned"] == planned, summary
    assert (summary["client_errors"] > 0) == errors_seen, summary
