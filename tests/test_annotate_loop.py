"""The human loop for real: ``smolforge annotate serve`` on a fresh home (private Redis, SQLite),
push from a trained run, two annotators answering through the SDK, restarts between submissions
(one a SIGKILL of argilla-server while a crowd submits: nothing acknowledged is lost),
pull, agreement and pairs, DPO on the pulled pairs, the pipeline step, and the CLI's errors.

Skipped when the argilla-server venv (``make setup``) or redis-server is missing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing

import pytest

from smolforge.annotate.server import REPO, SERVER_FILE, running_url
from smolforge.cli import main

from crowd_faults import assert_nothing_lost, crowd_under_fault

rg = pytest.importorskip("argilla")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (REPO / ".argilla-venv" / "bin" / "python").exists() or shutil.which("redis-server") is None,
    reason="needs .argilla-venv and redis-server (make setup)")]

KEY = os.environ.get("ARGILLA_API_KEY") or "argilla.apikey"
N = 12
# (annotator 1, annotator 2) per record, in record-id order; None = no answer
PLAN = [("response_1", "response_1"), ("response_2", "response_2"), ("response_1", "response_2"),
        ("tie", "tie"), ("response_2", "response_2"), ("response_1", "response_1"), ("response_2", "tie"),
        ("tie", "response_1"), ("response_1", "response_1"), ("response_2", "response_2"),
        ("response_1", None), ("discard", "discard")]


def start_serve(root):
    """``smolforge annotate serve`` as a user starts it; returns (process, url)."""
    proc = subprocess.Popen([sys.executable, "-m", "smolforge", "--runs-dir", str(root), "annotate", "serve"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("Argilla at http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(f"annotate serve printed {line!r}")
    return proc, line.split()[2]


def stop_serve(proc) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


@pytest.fixture(scope="module")
def loop(runs, sft_run, data_run):
    from smolforge.annotate.server import ArgillaServer
    from smolforge.errors import ServiceError

    proc, url = start_serve(runs.root)
    state = {"runs": runs, "proc": proc, "url": url, "sft": sft_run.name, "data": data_run.name}
    try:
        home = runs.root / ".argilla"
        assert json.loads((home / SERVER_FILE).read_text())["url"] == url == running_url(home)
        with pytest.raises(ServiceError, match=f"already running at {url}"):   # one server per home
            ArgillaServer(home).start()
        yield state
    finally:
        stop_serve(state["proc"])


def cli(loop, *args, capsys=None):
    rc = main(["--runs-dir", str(loop["runs"].root), "annotate", *args])
    out = capsys.readouterr() if capsys is not None else None
    return rc, out


def push_args(loop, **changes):
    values = {"runs": f"[{loop['sft']}]", "prompts": loop["data"], "limit": N, "k": 2, "generation": "hf",
              "sampling.temperature": 1.0, "sampling.max_new_tokens": 12, "dataset": "loop", "annotators": 2,
              "name": "prefs-loop"} | changes
    return [item for key, value in values.items() for item in ("--set", f"{key}={value}")]


def owner_dataset(loop, name="loop"):
    client = rg.Argilla(api_url=loop["url"], api_key=KEY)
    return client.datasets(name=name, workspace="argilla")


def test_push_creates_records_and_a_second_push_adds_no_duplicates(loop, capsys):
    rc, out = cli(loop, "push", *push_args(loop), capsys=capsys)
    assert rc == 0, out.err
    assert f"pushed {N} records to argilla/loop" in out.out and f"({N} new, 0 updated; {N} in the dataset)" in out.out
    rc, out = cli(loop, "push", *push_args(loop), capsys=capsys)
    assert rc == 0, out.err
    assert f"(0 new, {N} updated; {N} in the dataset)" in out.out

    records = list(owner_dataset(loop).records)
    assert len(records) == N == len({r.id for r in records})
    record = records[0]
    assert record.metadata["run_1"] == record.metadata["run_2"] == loop["sft"]
    assert record.metadata["temperature"] == 1.0 and record.metadata["max_new_tokens"] == 12
    prompt = record.fields["prompt"]
    assert isinstance(prompt, list) and prompt[0].role == "user"   # chat prompts stay chat
    settings = owner_dataset(loop).settings
    assert settings.distribution.min_submitted == 2 and "tie" in settings.guidelines


def decider(column: int):
    def decide(username, record):
        value = PLAN[record["index"]][column]
        if value is None:
            return None
        return ("response_1", "discarded") if value == "discard" else (value, "submitted")
    return decide


def snapshot(loop, min_votes):
    """What a pull computes (rows and report) from the live server, minus timings."""
    from smolforge.annotate.pull import resolve
    from smolforge.annotate.stage import Recipe, fetch

    rows, report = resolve(fetch(Recipe(dataset="loop"), loop["url"], KEY), min_votes=min_votes)
    return rows, report


def restart(loop, kill_server: bool, restore_from=None) -> None:
    """SIGKILL the argilla-server process of ``annotate serve``: the supervisor starts it again on the
    same URL. Or stop ``annotate serve`` (SIGTERM): no process of it (redis, server, worker) and no
    scratch folder is left, and it is started again; with ``restore_from`` (a backup file) on a fresh
    home restored from it."""
    import time

    import psutil

    home = loop["runs"].root / ".argilla"
    spawned = psutil.Process(loop["proc"].pid).children(recursive=True)
    assert len(spawned) >= 3                                         # redis, server, worker
    if kill_server:
        killed = json.loads((home / SERVER_FILE).read_text())["server_pid"]
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 90
        while json.loads((home / SERVER_FILE).read_text())["server_pid"] == killed or running_url(home) is None:
            assert time.monotonic() < deadline, "annotate serve did not start the killed server again"
            time.sleep(0.3)
        assert loop["proc"].poll() is None and running_url(home) == loop["url"]
        return
    assert stop_serve(loop["proc"]) == 0
    gone, alive = psutil.wait_procs(spawned, timeout=10)
    assert not alive, alive
    assert running_url(home) is None and not (home / SERVER_FILE).exists() and not (home / "tmp").exists()
    if restore_from is not None:
        shutil.rmtree(home)                                           # a fresh home: nothing but the restore
        assert cli(loop, "restore", str(restore_from))[0] == 0
        assert sorted(p.name for p in home.iterdir()) == ["argilla.db"]
    loop["proc"], loop["url"] = start_serve(loop["runs"].root)


def test_two_annotators_survive_restarts_and_pull_into_pairs_with_agreement(loop, capsys):
    from sklearn.metrics import cohen_kappa_score

    from smolforge.annotate.scripted import answer_all, records_to_answer, scripted_users

    records = sorted(records_to_answer(loop["url"], KEY, "loop", "argilla"), key=lambda r: r["id"])
    assert len(records) == N
    for i, record in enumerate(records):
        record["index"] = i
    (first, key_1), (second, key_2) = scripted_users(loop["url"], KEY, "argilla", 2)

    backups = loop["runs"].root.parent / "backups"
    during = backups / "during.db"
    counts: dict = {}
    submitting = threading.Thread(target=lambda: counts.update(answer_all(loop["url"], key_1, records, decider(0))))
    submitting.start()
    try:
        assert cli(loop, "backup", str(during))[0] == 0               # SQLite's online backup, mid-submission
    finally:
        submitting.join(timeout=300)
    assert (counts["submitted"], counts["discarded"]) == (N - 1, 1)
    with closing(sqlite3.connect(during)) as copy:                   # a consistent snapshot: whole rows only
        assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert 0 <= copy.execute("select count(*) from responses").fetchone()[0] <= N
    before = snapshot(loop, min_votes=1)
    after = backups / "after.db"
    assert cli(loop, "backup", str(after))[0] == 0
    assert cli(loop, "backup", str(after))[0] == 2                    # never overwrites a backup
    restart(loop, kill_server=False, restore_from=after)
    assert snapshot(loop, min_votes=1) == before                      # the restored home pulls the same

    counts = answer_all(loop["url"], key_2, records, decider(1))
    assert (counts["submitted"], counts["discarded"], counts["skipped"]) == (N - 2, 1, 1)
    before = snapshot(loop, min_votes=2)
    # SIGKILL of argilla-server while a crowd submits to another dataset: `annotate serve` starts it again
    summary, checked = crowd_under_fault(loop["url"], KEY, "crowd", lambda: restart(loop, kill_server=True),
                                         annotators=2, records=24)
    with capsys.disabled():
        print(f"\nSIGKILL argilla-server: {summary['responses']} acknowledged, {summary['client_errors']} client "
              f"errors {summary['error_kinds']}, {summary['acknowledged_on_retry']} acknowledged on retry; {checked}")
    assert_nothing_lost(summary, checked, 2 * 24, errors_seen=True)
    assert snapshot(loop, min_votes=2) == before

    rc, out = cli(loop, "status", *push_args(loop), capsys=capsys)
    assert rc == 0, out.err
    assert re.search(rf"{first} +{N - 1} +0 +1\n{second} +{N - 2} +0 +1", out.out), out.out
    assert f"of {N} records complete (2 submitted answers each)" in out.out

    rc, out = cli(loop, "pull", *push_args(loop), capsys=capsys)
    assert rc == 0, out.err
    run = loop["runs"].get("prefs-loop")
    report = json.loads((run.path / "annotations.json").read_text())
    agreed = [i for i, (a, b) in enumerate(PLAN) if a == b and a not in ("tie", "discard")]
    texts = {r["index"]: r["responses"] for r in records}
    usable = [i for i in agreed if texts[i][0] != texts[i][1] and texts[i][0].strip() and texts[i][1].strip()]
    assert report["counts"] == {"used": len(usable), "tied": 1, "disagreed": 3, "discarded": 1, "pending": 1,
                                "unusable": len(agreed) - len(usable)}
    assert f"{N} records: used {len(usable)}, tied 1, disagreed 3, discarded 1, pending 1" in out.out

    both = [(a, b) for a, b in PLAN if a not in (None, "discard") and b not in (None, "discard")]
    expected = cohen_kappa_score([a for a, _ in both], [b for _, b in both])
    assert report["agreement"]["metric"] == "cohen_kappa" and report["agreement"]["annotators"] == 2
    assert report["agreement"]["value"] == pytest.approx(expected)

    rows = [json.loads(line) for line in (run.path / "data" / "prefs" / "part-00000.jsonl").read_text().splitlines()]
    assert len(rows) == len(usable)
    for row in rows:
        assert row["chosen"][0]["role"] == "assistant" and row["prompt"][0]["role"] == "user"
    chosen = sorted(row["chosen"][0]["content"] for row in rows)
    winners = sorted(texts[i][int(PLAN[i][0][-1]) - 1] for i in usable)
    assert chosen == winners
    assert run.parents == [loop["sft"], loop["data"]]

    rc, _ = cli(loop, "pull", *push_args(loop, name="prefs-loop-again"), capsys=capsys)
    assert rc == 0
    again = loop["runs"].get("prefs-loop-again")
    assert (again.path / "data" / "prefs" / "part-00000.jsonl").read_bytes() == \
        (run.path / "data" / "prefs" / "part-00000.jsonl").read_bytes()


def test_dpo_trains_on_the_pulled_pairs(loop):
    from conftest import run_stage

    run = run_stage("dpo", loop["runs"], name="dpo-from-review", parent=loop["sft"], data="prefs-loop")
    assert run.status == "done" and (run.model_dir / "model.safetensors").is_file()
    assert run.metrics["train/steps"] == 6
    assert "prefs-loop" in run.parents
    lineage = loop["runs"].lineage("dpo-from-review")
    assert any(p["name"] == "prefs-loop" and p["stage"] == "annotate" for p in lineage["parents"])


def test_pipeline_step_pushes_lets_scripted_annotators_answer_and_pulls(loop, tmp_path, capsys):
    """The verifier-driven annotators prefer the response that states the reference answer; the test
    makes the run's own first sample the reference (sampling is seeded, so the push samples it again)."""
    from smolforge.annotate.generate import generate_responses
    from smolforge.annotate.prompts import load_prompts
    from smolforge.annotate.stage import Recipe, Sampling, Scripted, run as run_step

    runs = loop["runs"]
    rows, _ = load_prompts(loop["data"], runs, limit=8)
    sampling = Sampling(temperature=1.0, max_new_tokens=10, seed=3)
    texts = generate_responses({loop["sft"]: runs.get(loop["sft"]).model_dir}, [r["prompt"] for r in rows], 2,
                               vars(sampling))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": t[0]}) + "\n"
                               for r, t in zip(rows, texts) if t[0].strip()))
    recipe = Recipe(name="prefs-scripted", runs=[loop["sft"]], prompts=str(prompts), limit=None, sampling=sampling,
                    generation="hf", dataset="loop-scripted", annotators=2, wait=5, poll=0.5,
                    scripted=Scripted(annotators=2, noise=0.0))
    run = run_step(recipe, runs, overwrite=True)
    report = json.loads((run.path / "annotations.json").read_text())
    assert [s["submitted"] + s["discarded"] for s in report["scripted"]] == [report["records"]] * 2
    assert report["waited"]["completed"] == report["records"]
    answers = {json.dumps(json.loads(line)["prompt"]): json.loads(line)["answer"]
               for line in prompts.read_text().splitlines()}
    pairs = [json.loads(line) for line in (run.path / "data" / "prefs" / "part-00000.jsonl").read_text().splitlines()]
    assert pairs and report["counts"]["disagreed"] == 0
    for pair in pairs:
        assert pair["chosen"][0]["content"] == answers[json.dumps(pair["prompt"])]
    assert run.info["started_at"] < run.info["ended_at"]


def test_cli_errors_unreachable_wrong_key_and_schema_mismatch(loop, capsys, monkeypatch):
    secret = "sk-never-print-this-4711"
    monkeypatch.setenv("ARGILLA_API_KEY", secret)
    rc, out = cli(loop, "push", *push_args(loop, url="http://127.0.0.1:9"), capsys=capsys)
    assert rc == 2 and "Argilla is not reachable at http://127.0.0.1:9" in out.err
    rc, out = cli(loop, "pull", *push_args(loop, url=loop["url"]), capsys=capsys)
    assert rc == 2 and f"Argilla at {loop['url']} rejected the API key" in out.err
    assert secret not in out.err + out.out

    monkeypatch.setenv("ARGILLA_API_KEY", KEY)
    rc, out = cli(loop, "push", *push_args(loop, k=3), capsys=capsys)
    assert rc == 2
    assert "schema mismatch on re-push: field 'response_3' is missing from the existing dataset" in out.err
    assert len(list(owner_dataset(loop).records)) == N
    logs = "".join(p.read_text(errors="replace") for p in (loop["runs"].root / ".argilla" / "logs").glob("*.log"))
    assert KEY not in logs and secret not in logs


def test_rankings_keep_their_ranks_and_ties_through_the_server(loop, capsys):
    """The SDK reads a ranking back as a bare list of names; the pull must use the stored ranks."""
    from smolforge.annotate.scripted import answer_all, records_to_answer, scripted_users

    sets = push_args(loop, k=3, limit=3, dataset="loop-rank", name="prefs-rank", rating="true")
    rc, out = cli(loop, "push", *sets, capsys=capsys)
    assert rc == 0, out.err
    records = sorted(records_to_answer(loop["url"], KEY, "loop-rank", "argilla"), key=lambda r: r["id"])
    ranks = [[3, 1, 2], [2, 2, 1], [1, 1, 1]]    # a full order; a tie for last; all equal

    def ranked(username, record):
        order = ranks[records.index(next(r for r in records if r["id"] == record["id"]))]
        return [{"value": f"response_{i}", "rank": rank} for i, rank in enumerate(order, start=1)], "submitted"

    for _, key in scripted_users(loop["url"], KEY, "argilla", 2):
        answer_all(loop["url"], key, records, ranked)
    rc, out = cli(loop, "pull", *sets, capsys=capsys)
    assert rc == 0, out.err
    run = loop["runs"].get("prefs-rank")
    report = json.loads((run.path / "annotations.json").read_text())
    assert len(set(records[0]["responses"])) == 3, records[0]["responses"]   # seeded samples of 12 tokens
    assert report["counts"] == {"used": 1, "tied": 2, "disagreed": 0, "discarded": 0, "pending": 0, "unusable": 0}
    assert report["agreement"]["metric"] == "krippendorff_alpha_ordinal" and report["agreement"]["value"] == 1.0
    row = json.loads((run.path / "data" / "prefs" / "part-00000.jsonl").read_text())
    assert row["chosen"][0]["content"] == records[0]["responses"][1]     # rank 1: response_2
    assert row["rejected"][0]["content"] == records[0]["responses"][0]   # rank 3: response_1
