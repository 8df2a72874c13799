"""The real Argilla web UI, driven in headless Chromium: an annotator signs in and judges a record,
and hostile model output (HTML, scripts, markdown, control characters, lone surrogates, huge
texts) is shown as text, runs nothing, and comes back from a pull exactly as it was pushed.

The dataset is built the way a push builds it (review_schema → build_settings, build_record →
to_record); the browser is Debian's chromium driven by Playwright (no downloaded browser). The
answer given in the UI is then read back through the SDK as the owner. A screenshot after the
submit is kept under the pytest tmp dir and copied to .artifacts/annotate-ui.png; on a failure the
page's screenshot and HTML go to .artifacts/annotate-ui-failure.{png,html}.

Skipped when the argilla-server venv (``make setup``), redis-server, chromium or Playwright is missing.
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import time

import pytest

from smolforge.annotate.records import GUIDELINES, LABEL_TEXT, build_record, build_settings, review_schema, to_record
from smolforge.annotate.server import REPO, connect
from smolforge.annotate.users import add_user

rg = pytest.importorskip("argilla")
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (REPO / ".argilla-venv" / "bin" / "python").exists() or shutil.which("redis-server") is None
    or CHROMIUM is None,
    reason="needs .argilla-venv, redis-server and chromium (make setup)")]

ARTIFACTS = REPO / ".artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
UI_TIMEOUT_MS = 20_000      # per step; a cold page load takes ≈1 s here
ANNOTATOR = "ui-annotator"
SAMPLING = {"temperature": 0.7}
ITEMS = [("What is the capital of France?", "Paris.", "Lyon."),
         ("Name a primary colour.", "Red.", "Purple."),
         ("How many legs does a spider have?", "Eight.", "Six.")]
CHOICE = "response_2"       # not the option the UI focuses first: only the click can have chosen it


@pytest.fixture(scope="module")
def server(argilla_server):
    return argilla_server


@pytest.fixture(scope="module")
def review(server):
    """``(dataset, annotator, password, records by id)``: a 2-response review dataset and an annotator
    account made as ``smolforge annotate users add`` makes it (on the session's server, bound to 0.0.0.0)."""
    client = connect(server.url, server.api_key)
    workspace = client.workspaces("argilla")
    if workspace is None:                       # create_default makes it with the owner; a server might not
        workspace = rg.Workspace(name="argilla", client=client).create()
    password = add_user(client, ANNOTATOR)             # `smolforge annotate users add`: a generated password
    annotator = client.users(ANNOTATOR)
    dataset = rg.Dataset(name="review-ui", workspace="argilla", client=client,
                         settings=build_settings(review_schema(2, sampling=SAMPLING))).create()
    items = [build_record(prompt, [a, b], ["run-a", "run-b"], SAMPLING) for prompt, a, b in ITEMS]
    dataset.records.log([to_record(item) for item in items])
    return dataset, annotator, password, {item["id"]: item for item in items}


@contextlib.contextmanager
def evidence_on_failure(page):
    """Re-raise any failure after saving the page's screenshot and HTML to .artifacts/."""
    try:
        yield
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        with contextlib.suppress(Exception):
            page.screenshot(path=str(ARTIFACTS / "annotate-ui-failure.png"), full_page=True)
        with contextlib.suppress(Exception):
            (ARTIFACTS / "annotate-ui-failure.html").write_text(page.content())
        raise


def answers(dataset) -> dict:
    """``{record id: [(user id, question, value, status)]}`` of every record that has a response."""
    return {r.id: [(str(a.user_id), a.question_name, a.value, getattr(a.status, "value", a.status))
                   for a in r.responses]
            for r in dataset.records(with_responses=True) if list(r.responses)}


def sign_in(page, server, password: str) -> None:
    page.goto(server.url)
    page.get_by_label("Username").fill(ANNOTATOR)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def test_annotator_submits_a_preference_in_the_web_ui(server, review, tmp_path):
    dataset, annotator, password, items = review
    for stale in ARTIFACTS.glob("annotate-ui-failure.*"):          # evidence belongs to the latest run
        stale.unlink()
    expect = sync_api.expect

    def visible(locator):
        expect(locator).to_be_visible(timeout=UI_TIMEOUT_MS)

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(UI_TIMEOUT_MS)
            with evidence_on_failure(page):
                sign_in(page, server, password)
                page.get_by_text("review-ui", exact=True).click()           # the dataset card on the home page

                # the annotation view shows one record: its prompt and both responses, in the record's order
                visible(page.get_by_text("Which response is better?"))
                prompts = {rid: page.get_by_text(item["fields"]["prompt"], exact=True) for rid, item in items.items()}
                any_prompt = functools.reduce(lambda a, b: a.or_(b), prompts.values())
                visible(any_prompt.first)
                shown = [rid for rid, prompt in prompts.items() if prompt.is_visible()]
                assert len(shown) == 1, f"expected one record's prompt on screen, saw {len(shown)}"
                record = items[shown[0]]
                for slot in ("response_1", "response_2"):
                    visible(page.get_by_text(record["fields"][slot], exact=True))

                # the dataset's guidelines (markdown, rendered) open from the panel under the record
                panels = page.get_by_role("button", name="Expand Panel").filter(visible=True)
                panels.filter(has_text="Guidelines").click()
                visible(page.get_by_text(GUIDELINES.splitlines()[0]).filter(visible=True))
                visible(page.locator("strong", has_text="tie").filter(visible=True))      # **tie**

                option = page.get_by_role("checkbox", name=LABEL_TEXT[CHOICE], include_hidden=True)
                page.get_by_text(LABEL_TEXT[CHOICE], exact=True).click()
                expect(option).to_be_checked(timeout=UI_TIMEOUT_MS)
                page.get_by_role("button", name="Submit").click()

                # the UI moves on to the next pending record and counts the submission
                expect(prompts[record["id"]]).to_be_hidden(timeout=UI_TIMEOUT_MS)
                counter = page.get_by_role("listitem").filter(has_text=re.compile("submitted", re.I))
                expect(counter.filter(visible=True)).to_have_text(re.compile(r"submitted\s*1$", re.I),
                                                                  timeout=UI_TIMEOUT_MS)
                shot = tmp_path / "annotate-ui.png"
                page.screenshot(path=str(shot))
        finally:
            browser.close()

    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "annotate-ui.png")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, len(data)
    from PIL import Image
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900)
    assert len(image.getcolors(maxcolors=1 << 20)) > 100        # text and widgets, not a blank page

    expected = {record["id"]: [(str(annotator.id), "preference", CHOICE, "submitted")]}
    deadline = time.monotonic() + 10
    while answers(dataset) != expected and time.monotonic() < deadline:
        time.sleep(0.3)
    assert answers(dataset) == expected


MARKUP = ('<script>top.__pwned = "script"</script><img id="pwn-img" src="x" onerror="top.__pwned = \'img\'">'
          '<div id="pwn-overlay" style="position:fixed;inset:0;z-index:99999;background:red">covered</div>'
          '\n# Not a heading\n**not bold** [click me](javascript:top.__pwned="link")')
CONTROL = "tab\tbell\x07 nul\x00 esc\x1b[31mred\x1b[0m del\x7f rtl\u202eevil zero\u200bwidth, half a pair \ud83d and \udcff"
HUGE = "An endless answer. " * 6_000 + "x" * 30_000          # 144k characters, a 30k-character unbroken line
HOSTILE = [("Write HTML, please.", MARKUP, "A plain answer."), ("Print odd bytes.", CONTROL, "Another plain answer."),
           ("Go on forever.", HUGE, "Short.")]


def test_hostile_model_output_is_shown_as_text_and_pulled_byte_identical(server, review, tmp_path):
    """Pushed as ``annotate push`` pushes; judged in the UI (the hostile response wins, so every one is pulled)."""
    from smolforge.annotate.push import find_dataset, push_records
    from smolforge.cli import main
    from smolforge.errors import RecipeError

    _, _, password, _ = review
    client = connect(server.url, server.api_key)
    items = {prompt: build_record(prompt, [bad, plain], ["run-a", "run-b"], SAMPLING) for prompt, bad, plain in HOSTILE}
    schema = review_schema(2, sampling=SAMPLING)
    with pytest.raises(RecipeError, match=r"^push: record 3 \(.*prompt 'Go on forever.'\): response_\d has 144,000 "
                                          r"characters, more than max_chars=100,000; lower sampling.max_new_tokens"):
        push_records(client, "hostile-ui", "argilla", schema, list(items.values()), max_chars=100_000)
    assert find_dataset(client, "hostile-ui", "argilla") is None              # refused before anything was sent
    push_records(client, "hostile-ui", "argilla", schema, list(items.values()))
    expect = sync_api.expect
    dialogs = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            with evidence_on_failure(page):
                sign_in(page, server, password)
                page.get_by_text("hostile-ui", exact=True).click()
                for _ in HOSTILE:
                    expect(page.get_by_text("Which response is better?")).to_be_visible(timeout=UI_TIMEOUT_MS)
                    prompt = next(p for p, _, _ in HOSTILE if page.get_by_text(p, exact=True).is_visible())
                    item = items[prompt]
                    bad_slot = next(slot for slot in ("response_1", "response_2")
                                    if item["fields"][slot] not in ("A plain answer.", "Another plain answer.", "Short."))
                    if prompt == "Write HTML, please.":      # the markup is on screen as characters
                        expect(page.get_by_text('<script>top.__pwned = "script"</script>')).to_be_visible()
                        expect(page.get_by_text("**not bold** [click me]")).to_be_visible()
                    elif prompt == "Print odd bytes.":
                        expect(page.get_by_text("half a pair \ufffd and \ufffd")).to_be_visible()
                    else:
                        expect(page.get_by_text("An endless answer. An endless answer.")).to_be_visible()
                    assert page.evaluate("window.__pwned") is None and not dialogs
                    assert page.locator("#pwn-img, #pwn-overlay, iframe, h1:has-text('Not a heading')").count() == 0
                    page.screenshot(path=str(tmp_path / f"hostile-{len(list(tmp_path.glob('hostile-*')))}.png"))
                    # no layout broken beyond scrolling: the page does not widen, the controls stay reachable
                    assert page.evaluate("document.documentElement.scrollWidth") <= 1280 + 1
                    page.get_by_text(LABEL_TEXT[bad_slot], exact=True).click()
                    submit = page.get_by_role("button", name="Submit")
                    expect(submit).to_be_in_viewport()
                    submit.click()
                    expect(page.get_by_text(prompt, exact=True)).to_be_hidden(timeout=UI_TIMEOUT_MS)
                page.wait_for_timeout(500)          # anything deferred (an onerror, a timer) had its chance
                assert page.evaluate("window.__pwned") is None and not dialogs
        finally:
            browser.close()

    runs = tmp_path / "runs"
    args = ["--runs-dir", str(runs), "annotate", "pull", "--set", f"home={server.home}", "--set", "dataset=hostile-ui",
            "--set", "name=prefs-hostile", "--set", "annotators=1"]
    dataset = client.datasets(name="hostile-ui", workspace="argilla")
    deadline = time.monotonic() + 10
    while len(answers(dataset)) < len(HOSTILE) and time.monotonic() < deadline:   # the last submit may be landing
        time.sleep(0.3)
    assert main(args) == 0
    data = (runs / "prefs-hostile" / "data" / "prefs" / "part-00000.jsonl").read_bytes()
    rows = {row["prompt"]: row for row in map(json.loads, data.splitlines())}
    assert {prompt: (row["chosen"], row["rejected"]) for prompt, row in rows.items()} == \
        {prompt: (bad, plain) for prompt, bad, plain in HOSTILE}
    assert b"\\ud83d" in data and b"\\u0000" in data          # lone surrogates and NUL travel as JSON escapes
