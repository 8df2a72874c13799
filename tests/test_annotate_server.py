"""The embedded Argilla server for real: private Redis, SQLite home, smolforge-sql search engine.

Skipped when the argilla-server venv (``make setup``) or redis-server is missing.
"""
from __future__ import annotations

import os
import shutil
import time

import pytest

from smolforge.annotate.server import REPO, ArgillaServer, connect
from smolforge.errors import ServiceError

rg = pytest.importorskip("argilla")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (REPO / ".argilla-venv" / "bin" / "python").exists() or shutil.which("redis-server") is None,
    reason="needs .argilla-venv and redis-server (make setup)")]

TEXTS = ["The capital of France is Paris.", "Berlin is the capital of Germany.",
         "Paris Hilton is not a city.", "Madrid has good weather."]
TOPICS = ["geo", "geo", "people", "weather"]


@pytest.fixture(scope="module")
def live(argilla_server):
    """The session's Argilla server (restarts under SIGTERM and SIGKILL: test_annotate_loop)."""
    return argilla_server


def dataset_of(server):
    client = connect(server.url, server.api_key)
    return client, client.datasets(name="review", workspace="argilla")


def ids(records) -> set[str]:
    return {r.id for r in records}


def test_sdk_logs_searches_and_submits(live):
    client = connect(live.url, live.api_key)
    settings = rg.Settings(fields=[rg.TextField(name="text")],
                           questions=[rg.LabelQuestion(name="label", labels=["good", "bad"])],
                           metadata=[rg.TermsMetadataProperty(name="topic"), rg.IntegerMetadataProperty(name="n")])
    dataset = rg.Dataset(name="review", workspace="argilla", settings=settings, client=client).create()
    dataset.records.log([rg.Record(id=f"r{i}", fields={"text": t}, metadata={"topic": TOPICS[i], "n": i})
                         for i, t in enumerate(TEXTS)])

    assert ids(dataset.records(query=rg.Query(query="paris"))) == {"r0", "r2"}
    assert ids(dataset.records(query=rg.Query(query="paris capital"))) == {"r0"}
    assert ids(dataset.records(query=rg.Query(query="par"))) == set()          # terms, not fragments
    assert ids(dataset.records(query=rg.Query(filter=rg.Filter(("metadata.topic", "==", "geo"))))) == {"r0", "r1"}
    assert ids(dataset.records(query=rg.Query(filter=rg.Filter(("metadata.n", ">=", 2))))) == {"r2", "r3"}
    pending = rg.Query(filter=rg.Filter(("response.status", "==", "pending")))
    assert ids(dataset.records(query=pending)) == {"r0", "r1", "r2", "r3"}

    for rid, label in (("r1", "good"), ("r3", "bad")):
        record = next(iter(dataset.records(query=rg.Query(filter=rg.Filter(("id", "==", rid))))))
        record.responses.add(rg.Response("label", label, user_id=client.me.id, status="submitted"))
        dataset.records.log([record])

    submitted = rg.Query(filter=rg.Filter(("response.status", "==", "submitted")))
    assert ids(dataset.records(query=submitted)) == {"r1", "r3"}
    assert ids(dataset.records(query=pending)) == {"r0", "r2"}
    assert ids(dataset.records(query=rg.Query(query="capital", filter=rg.Filter(
        ("response.status", "==", "pending"))))) == {"r0"}
    progress = dataset.progress()
    assert (progress["total"], progress["completed"], progress["pending"]) == (4, 2, 2)
    answers = {r.id: [(a.value, getattr(a.status, "value", a.status)) for a in r.responses]
               for r in dataset.records(with_responses=True) if r.responses}
    assert answers == {"r1": [("good", "submitted")], "r3": [("bad", "submitted")]}


def submitted_answers(server) -> dict:
    _, dataset = dataset_of(server)
    return {r.id: [(a.value, getattr(a.status, "value", a.status)) for a in r.responses]
            for r in dataset.records(with_responses=True) if r.responses}


def test_status_filters_are_per_user(live):
    client, dataset = dataset_of(live)
    user = rg.User(username="ann", password="annotator-pass", role="annotator", client=client).create()
    client.workspaces("argilla").add_user(user)
    import httpx
    key = httpx.get(f"{live.url}/api/v1/users/{user.id}",
                    headers={"X-Argilla-Api-Key": live.api_key}).json()["api_key"]
    server_ids = {r.id: r._server_id for r in dataset.records}
    for external_id, status, value in (("r0", "discarded", "bad"), ("r2", "draft", "good")):
        reply = httpx.post(f"{live.url}/api/v1/records/{server_ids[external_id]}/responses",  # as the UI
                           json={"values": {"label": {"value": value}}, "status": status},
                           headers={"X-Argilla-Api-Key": key})
        assert reply.status_code == 201, reply.text

    def ui_hits(filters, query=None):               # what the annotation UI asks: /me/…/records/search
        body = {"filters": {"and": filters}}
        if query:
            body["query"] = {"text": {"q": query}}
        reply = httpx.post(f"{live.url}/api/v1/me/datasets/{dataset.id}/records/search",
                           json=body, headers={"X-Argilla-Api-Key": key})
        assert reply.status_code == 200, reply.text
        return {item["record"]["external_id"] for item in reply.json()["items"]}

    def status(*values):
        return {"type": "terms", "scope": {"entity": "response", "property": "status"}, "values": list(values)}

    assert ui_hits([status("pending")]) == {"r1", "r3"}
    assert ui_hits([status("discarded")]) == {"r0"}
    assert ui_hits([status("draft", "pending")]) == {"r1", "r2", "r3"}
    assert ui_hits([status("pending")], query="capital") == {"r1"}
    assert ui_hits([{"type": "terms", "scope": {"entity": "response", "question": "label"}, "values": ["good"]}]) \
        == {"r2"}

    def hits(status):                 # the SDK's dataset search spans every user (as with Elasticsearch)
        return ids(dataset.records(query=rg.Query(filter=rg.Filter(("response.status", "in", status)))))

    assert hits(["pending"]) == set()                # pending there = no response from anyone
    assert hits(["submitted"]) == {"r1", "r3"}
    assert hits(["discarded", "draft"]) == {"r0", "r2"}

def test_sort_offset_limit_through_the_api(live):
    import httpx
    _, dataset = dataset_of(live)
    body = {"sort": [{"scope": {"entity": "metadata", "metadata_property": "n"}, "order": "desc"}]}
    reply = httpx.post(f"{live.url}/api/v1/datasets/{dataset.id}/records/search",
                       params={"offset": 1, "limit": 2}, json=body,
                       headers={"X-Argilla-Api-Key": live.api_key})
    reply.raise_for_status()
    got = reply.json()
    assert got["total"] == 4
    assert [item["record"]["external_id"] for item in got["items"]] == ["r2", "r1"]


def test_worker_recomputes_status_when_distribution_changes(live):
    _, dataset = dataset_of(live)
    assert dataset.progress()["completed"] == 2
    dataset.settings.distribution = rg.TaskDistribution(min_submitted=2)
    dataset.update()                         # the server queues a job; the rq worker recomputes each record
    deadline = time.time() + 30
    while dataset.progress()["completed"] != 0 and time.time() < deadline:
        time.sleep(0.5)
    assert dataset.progress()["completed"] == 0


def test_metrics_the_ui_reads(live):
    import httpx
    _, dataset = dataset_of(live)
    api = httpx.Client(base_url=f"{live.url}/api/v1", headers={"X-Argilla-Api-Key": live.api_key})
    mine = api.get(f"/me/datasets/{dataset.id}/metrics").json()
    assert mine == {"responses": {"total": 4, "submitted": 2, "discarded": 0, "draft": 0, "pending": 2}}
    props = {p["name"]: p["id"] for p in api.get(f"/me/datasets/{dataset.id}/metadata-properties").json()["items"]}
    topic = api.get(f"/metadata-properties/{props['topic']}/metrics").json()
    assert topic["total"] == 4 and {v["term"]: v["count"] for v in topic["values"]} == \
        {"geo": 2, "people": 1, "weather": 1}
    assert {k: api.get(f"/metadata-properties/{props['n']}/metrics").json()[k] for k in ("min", "max")} == \
        {"min": 0, "max": 3}


def test_wrong_api_key_is_a_clear_error(live):
    with pytest.raises(ServiceError, match="rejected the API key") as err:
        connect(live.url, "not-the-key")
    assert "not-the-key" not in str(err.value)


def test_unreachable_server_is_a_clear_error():
    from smolforge.annotate.server import free_port
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServiceError, match=f"not reachable at {url}"):
        connect(url, os.environ.get("ARGILLA_API_KEY") or "argilla.apikey")


def test_api_key_never_in_logs(live):
    for log in (live.home / "logs").glob("*.log"):
        assert live.api_key not in log.read_text(errors="replace"), log


def test_start_failure_names_the_log(tmp_path):
    """Redis's port is taken: redis exits at once, the error names its log, and nothing is left running."""
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = ArgillaServer(tmp_path / "home", redis_port=busy.getsockname()[1], ready_timeout=60)
        with pytest.raises(ServiceError, match=r"redis process exited .*redis\.log") as err:
            server.start()
    assert "address already in use" in str(err.value).lower()
    assert not server.procs


def test_users_search_engine_is_used_when_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("ARGILLA_SEARCH_ENGINE", raising=False)
    assert ArgillaServer(tmp_path).env()["ARGILLA_SEARCH_ENGINE"] == "smolforge-sql"
    monkeypatch.setenv("ARGILLA_ELASTICSEARCH", "http://127.0.0.1:9200")
    assert ArgillaServer(tmp_path).env()["ARGILLA_SEARCH_ENGINE"] == "elasticsearch"
    monkeypatch.setenv("ARGILLA_SEARCH_ENGINE", "opensearch")
    assert ArgillaServer(tmp_path).env()["ARGILLA_SEARCH_ENGINE"] == "opensearch"
    monkeypatch.setenv("ARGILLA_API_KEY", "secret-key")
    assert "ARGILLA_API_KEY" not in ArgillaServer(tmp_path).env()


def test_search_engine_doctests_in_the_argilla_venv(tmp_path):
    import subprocess
    env = dict(os.environ, ARGILLA_HOME_PATH=str(tmp_path), TMPDIR=str(tmp_path))
    done = subprocess.run([str(REPO / ".argilla-venv" / "bin" / "python"), "-m", "doctest", "-v",
                           str(REPO / "annotate" / "search_engine.py")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "0 failed" in done.stdout


def test_a_network_server_runs_on_generated_owner_credentials_and_refuses_the_demo_ones(live):
    from smolforge.annotate.server import DEMO_API_KEY, DEMO_PASSWORD, OWNER_FILE

    import httpx

    assert live.host == "0.0.0.0" and live.url.startswith("http://127.0.0.1:")
    stored = live.home / OWNER_FILE
    assert oct(stored.stat().st_mode & 0o777) == "0o600"
    assert live.api_key != DEMO_API_KEY and len(live.api_key) >= 32 and live.password != DEMO_PASSWORD
    with pytest.raises(ServiceError, match="rejected the API key"):
        connect(live.url, DEMO_API_KEY)
    login = f"{live.url}/api/v1/token"          # the UI's sign-in
    assert httpx.post(login, data={"username": "argilla", "password": DEMO_PASSWORD}).status_code == 401
    assert httpx.post(login, data={"username": "argilla", "password": live.password}).status_code == 201
    for log in (live.home / "logs").glob("*.log"):                  # generated secrets are never logged
        assert live.password not in log.read_text(errors="replace"), log


@pytest.mark.parametrize("env", [{"ARGILLA_API_KEY": "argilla.apikey"}, {"ARGILLA_PASSWORD": "12345678"},
                                 {"ARGILLA_API_KEY": "short-key", "ARGILLA_PASSWORD": "a-long-enough-password"}])
def test_annotate_serve_on_a_network_address_refuses_demo_or_weak_credentials(env, tmp_path, monkeypatch, capsys):
    from smolforge.cli import main

    for name in ("ARGILLA_API_KEY", "ARGILLA_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    home = tmp_path / "home"
    assert main(["annotate", "serve", "--host", "0.0.0.0", "--home", str(home)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "annotate serve --host 0.0.0.0:" in err and "Traceback" not in err, err
    assert not home.exists()                                        # refused before anything started


def test_users_add_list_remove_through_the_cli(live, capsys):
    import httpx

    from smolforge.cli import main

    home = ["--home", str(live.home)]
    assert main(["annotate", "users", "add", "carol", *home]) == 0
    out = capsys.readouterr().out
    password = out.rsplit("password (shown only now): ", 1)[1].strip()
    assert len(password) >= 16
    login = f"{live.url}/api/v1/token"          # the UI's sign-in
    assert httpx.post(login, data={"username": "carol", "password": password}).status_code == 201
    assert main(["annotate", "users", "list", *home]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["carol", "annotator", "argilla"] in rows and any(row[:2] == ["argilla", "owner"] for row in rows)
    assert main(["annotate", "users", "add", "carol", *home]) == 2             # exists: a clear error
    assert "user 'carol' already exists" in capsys.readouterr().err
    assert main(["annotate", "users", "add", "Carol Smith", *home]) == 2
    assert main(["annotate", "users", "remove", "carol", *home]) == 0
    assert httpx.post(login, data={"username": "carol", "password": password}).status_code == 401
    assert main(["annotate", "users", "remove", "argilla", *home]) == 2
    for log in (live.home / "logs").glob("*.log"):
        assert password not in log.read_text(errors="replace"), log


LAUNCH_TWICE = """
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
import argilla_launch

os.environ.update(SMOLFORGE_ARGILLA_OWNER_KEY="argilla.apikey", SMOLFORGE_ARGILLA_OWNER_PASSWORD="12345678")
argilla_launch.prepare()                               # a loopback start: the owner on the demo pair


async def annotator_on_the_demo_password():          # as an old demo home may hold
    from argilla_server.contexts import accounts
    from argilla_server.database import AsyncSessionLocal, async_engine
    async with AsyncSessionLocal() as db:
        await accounts.create_user(db, {"username": "bob", "first_name": "bob", "last_name": None,
                                        "password": "12345678", "role": "annotator"})
    await async_engine.dispose()

asyncio.run(annotator_on_the_demo_password())
os.environ.update(SMOLFORGE_ARGILLA_OWNER_KEY="k" * 32, SMOLFORGE_ARGILLA_OWNER_PASSWORD="p" * 16,
                  SMOLFORGE_ARGILLA_NETWORK="1")
argilla_launch.prepare()                               # the same home on a network address
"""


def test_a_network_start_refuses_a_home_whose_users_still_have_the_demo_credentials(tmp_path):
    """The launcher's last line of defence: the owner gets the strong pair, but an annotator left on the
    demo password stops the start (exit 3) and is named."""
    import importlib.util
    import subprocess

    from smolforge.annotate.server import DEMO_PASSWORD

    spec = importlib.util.spec_from_file_location("argilla_launch", REPO / "annotate" / "argilla_launch.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    assert launcher.DEMO_PASSWORD == DEMO_PASSWORD                   # the launcher runs without smolforge: a copy
    env = {k: v for k, v in ArgillaServer(tmp_path).env().items() if not k.startswith("SMOLFORGE_ARGILLA")}
    done = subprocess.run([str(REPO / ".argilla-venv" / "bin" / "python"), "-c", LAUNCH_TWICE, str(REPO / "annotate")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "refusing to serve on a network address: users bob still have the demo API key or password" in done.stderr
    assert "argilla," not in done.stderr                     # the owner was given the strong pair first
