"""Reports and run comparison: report.html content, the compare table, and a real screenshot.

The unit tests build run folders by hand (no torch). The screenshot test trains the tiny
data → pretrain → SFT → DPO chain of conftest.py, scores each model with the eval stage, writes
the DPO run's report and renders it with headless Chromium (Debian's package, installed by
``make setup``): the PNG is kept under the pytest tmp dir and copied to .artifacts/report.png.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_stage
from smolforge.evals.compare import compare_data, compare_table, primary_scores
from smolforge.evals.report import curve_groups, render_report, write_report
from smolforge.errors import RunError
from smolforge.runs import Runs, write_json_atomic

ARTIFACTS = REPO / ".artifacts"


@pytest.fixture
def chain(tmp_path) -> Runs:
    """data-x → pretrain-x → sft-x → dpo-x, hand-made: logs, eval scores with stderr, a gates.json."""
    runs = Runs(tmp_path / "runs")
    with runs.start("data", "data-x", recipe={}, data_fingerprints={"data/sft": "sha256:" + "ab" * 32}) as data:
        data.finish(metrics={"data/sft_rows": 100})
    scores = {"pretrain-x": (0.30, 0.05, 0.0), "sft-x": (0.55, 0.06, 0.6083), "dpo-x": (0.61, 0.0456, 0.7292)}
    parent = data
    for stage, name in (("pretrain", "pretrain-x"), ("sft", "sft-x"), ("dpo", "dpo-x")):
        facts, facts_err, instruct = scores[name]
        parents = [parent, data] if stage != "pretrain" else [data]
        with runs.start(stage, name, recipe={"stage": stage}, parents=parents,
                        data_fingerprints=data.info["data_fingerprints"]) as run:
            for step in range(1, 11):
                record = {"loss": 3.0 / step, "learning_rate": 1e-3 * (1 - step / 10)}
                if step % 5 == 0:
                    record["eval_loss"] = 3.2 / step
                if stage == "dpo":
                    record.update({"rewards/margins": 0.1 * step, "rewards/chosen": 0.05 * step})
                run.log(step=step, **record)
            run.finish(metrics={"train/steps": 10, "train/loss": 0.3, "train/tokens": 1000 * len(name),
                                "facts/acc": facts, "facts/acc/stderr": facts_err, "facts/acc/random": 0.125,
                                "instruct/exact_match": instruct, "instruct/exact_match/stderr": 0.04,
                                "instruct/exact_match/random": 0.0, "prefs/margin": 3.5})
        parent = run
    write_json_atomic(runs.root / "dpo-x" / "gates.json", {
        "run": "dpo-x", "step": "step 4", "checked_at": "2026-01-01T00:00:00+00:00", "passed": False,
        "results": [{"rule": "instruct/exact_match >= parent - 0.01", "passed": False,
                     "message": "gate failed: instruct/exact_match 0.729 < parent sft-x 0.800 - 0.010"}]})
    return runs


# --------------------------------------------------------------------------- report content


def test_report_shows_header_scores_with_stderr_lineage_and_curves(chain):
    run = chain.get("dpo-x")
    path = write_report(run, chain)
    assert path == run.path / "report.html"
    assert [p.name for p in run.path.iterdir() if p.name.startswith(".")] == []  # atomic: no temp left
    page = path.read_text()
    assert "<h1>dpo-x</h1>" in page and "sft-x, data-x" in page
    assert "sha256:abababababab…" in page and "ab" * 32 not in page  # fingerprints abbreviated
    # eval scores: bars with ±stderr error bars and the random baseline
    own = page[page.index("<h2>Eval scores</h2>"):page.index("<h2>Along the lineage</h2>")]
    assert own.count('class="bar"') == 2 and own.count('class="errbar"') == 2
    assert 'data-stderr="0.0456"' in own and 'data-random="0.125"' in own
    assert "0.610" in own and "± 0.046" in own and "+0.485" in own  # score, stderr, vs random
    assert "prefs" in own and "3.500" in own  # non-primary metrics in the table
    # lineage: every scored ancestor, oldest first, grouped bars and a table
    lineage = page[page.index("<h2>Along the lineage</h2>"):page.index("<h2>Training curves</h2>")]
    assert lineage.count('class="bar"') == 6 and lineage.count('class="errbar"') == 6
    heads = re.findall(r"<th>([^<]*)</th>", lineage)
    assert heads[2:5] == ["pretrain-x (pretrain)", "sft-x (sft)", "dpo-x (dpo)"]
    assert "0.550 ± 0.060" in lineage and "+0.060" in lineage and "data-x" not in heads
    # training curves: loss with the sparse eval loss, learning rate, DPO rewards
    curves = page[page.index("<h2>Training curves</h2>"):]
    titles = re.findall(r'<svg class="plot line-plot" data-title="([^"]+)"', curves)
    assert titles == ["Learning rate", "Loss", "Reward"]
    assert 'data-series="eval_loss"' in curves and 'data-series="rewards/margins"' in curves
    # gates, self-containedness
    assert "Promotion gates: FAILED" in page and "0.729 &lt; parent sft-x 0.800 - 0.010" in page
    assert "<script" not in page and not re.search(r'(src|href)="https?:', page)


def test_report_of_a_run_without_logs_or_evals_is_notes_not_errors(chain):
    page = render_report(chain.get("data-x"), chain)
    assert "No metrics.jsonl in this run" in page
    assert "No eval scores in this run (run: smolforge eval --set run=data-x)" in page
    assert "No ancestor of this run has eval scores to compare with." in page
    assert "<svg" not in page and "none (a root run)" in page
    with chain.start("sft", "still-going", recipe={}) as run:
        run.log(step=1, loss=float("nan"))  # a diverged step and a line cut short by a crash
        with open(run.metrics_path, "a") as fh:
            fh.write('{"step": 2, "lo')
        page = render_report(run, chain)  # while running: no ended_at, no wall time yet
    assert "not finished (started" in page and "metrics.jsonl holds no numeric series to plot" in page


def test_curves_are_grouped_by_kind_and_thinned():
    records = [{"step": s, "loss": 1.0, "policy_loss": 0.1, "lr": 1e-4, "kl": 0.0, "approx_kl": 0.0,
                "reward": 0.5, "rewards/answer_match": 0.5, "completion_length": 7.0, "clipfrac": 0.01,
                "logps/chosen": -10.0, "time": 1.0, "epoch": 0.1} for s in range(2000)]
    groups = dict(curve_groups(records))
    assert list(groups) == ["Learning rate", "Loss", "KL", "Reward", "logps", "Other (1/2)", "Other (2/2)"]
    assert set(groups["Loss"]) == {"loss", "policy_loss"} and set(groups["KL"]) == {"kl", "approx_kl"}
    assert set(groups["Other (1/2)"]) == {"clipfrac"} and set(groups["Other (2/2)"]) == {"completion_length"}
    from smolforge.evals.report import line_chart

    svg = line_chart("Loss", groups["Loss"])
    first = re.search(r'<polyline points="([^"]+)"', svg).group(1)
    assert len(first.split()) == 600  # 2000 points thinned to 600, no per-point markers
    assert "<circle" not in svg


# --------------------------------------------------------------------------- compare


def test_compare_table_has_a_column_per_run_with_scores_and_training_figures(chain):
    with chain.start("grpo", "grpo-x", recipe={}, parents=[chain.get("dpo-x")]) as run:
        run.finish(metrics={"train/steps": 60, "rl/heldout_reward_before": 0.7727, "rl/heldout_reward_after": 0.9773})
    table = compare_table(chain, ["pretrain-x", "sft-x", "dpo-x", "grpo-x"])
    lines = table.splitlines()
    assert lines[0].split() == ["figure", "pretrain-x", "sft-x", "dpo-x", "grpo-x"]
    rows = {line[:36].strip(): line[36:].split("  ") for line in lines[2:]}
    cells = {k: [c.strip() for c in v if c.strip()] for k, v in rows.items()}
    assert cells["stage"] == ["pretrain", "sft", "dpo", "grpo"]
    assert cells["facts/acc (random 0.125)"] == ["0.300 ± 0.050", "0.550 ± 0.060", "0.610 ± 0.046", "-"]
    assert cells["instruct/exact_match (random 0.000)"][2] == "0.729 ± 0.040"
    assert cells["steps"] == ["10", "10", "10", "60"]
    assert cells["final loss"] == ["0.3", "0.3", "0.3", "-"]
    assert cells["rl/heldout_reward_before"] == ["-", "-", "-", "0.7727"]
    assert cells["rl/heldout_reward_after"] == ["-", "-", "-", "0.9773"]
    assert "prefs/margin" not in table  # only primary metrics (those with a random baseline)
    data = compare_data(chain, ["dpo-x"])
    assert data["runs"][0]["scores"]["facts/acc"] == {"value": 0.61, "stderr": 0.0456, "random": 0.125}


def test_compare_unknown_runs_name_the_close_matches(chain):
    with pytest.raises(RunError) as err:
        compare_table(chain, ["sft-x", "dpo-y", "pretrain"])
    message = str(err.value)
    assert message.startswith("unknown runs 'dpo-y' (did you mean 'dpo-x'?), 'pretrain' (did you mean 'pretrain-x'?)")
    assert "known runs: data-x, pretrain-x, sft-x, dpo-x" in message
    with pytest.raises(RunError, match="at least one run"):
        compare_table(chain, [])


# --------------------------------------------------------------------------- screenshot


def _chromium(args: list[str], profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed: run `make setup` (apt-get install chromium)"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # chromium and its helpers: the group we started
        proc.communicate()
        raise AssertionError(f"chromium hung for {timeout}s: {' '.join(cmd)}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


PROBE = """<script>
document.addEventListener('DOMContentLoaded', () => {
  const plots = [...document.querySelectorAll('svg.plot')].map(svg => {
    const box = svg.getBoundingClientRect();
    const marks = [...svg.querySelectorAll('polyline, circle, rect.bar')]
      .filter(m => { const b = m.getBBox(); return b.width > 0 || b.height > 0; }).length;
    return {title: svg.dataset.title, width: box.width, height: box.height, marks};
  });
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify(plots); document.body.appendChild(pre);
});
</script></body>"""


@pytest.fixture(scope="module")
def scored_chain(runs, data_run, pretrain_run, sft_run, dpo_run):
    for run in (pretrain_run, sft_run, dpo_run):
        run_stage("eval", runs, run=run.name, tasks=["facts", "instruct"])
    return runs, runs.get(dpo_run.name)


@pytest.mark.slow
def test_report_of_a_real_chain_renders_in_chromium(scored_chain, tmp_path):
    from PIL import Image

    runs, dpo = scored_chain
    path = write_report(dpo, runs)
    page = path.read_text()
    assert f"<h1>{dpo.name}</h1>" in page
    stderr = dpo.metrics["facts/acc/stderr"]
    assert f"± {stderr:.3f}" in page and f'data-stderr="{stderr:.6g}"' in page

    # the DOM chromium builds holds every plot, laid out with a real size and drawn marks
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE))
    dom = _chromium(["--dump-dom", probe.as_uri()], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    plots = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S).group(1)))
    titles = [p["title"] for p in plots]
    assert titles[:2] == [f"{dpo.name}: primary metric per task", "primary metric per task, by stage"]
    assert "Loss" in titles and "Learning rate" in titles and "Reward" in titles
    for plot in plots:
        assert plot["width"] > 300 and plot["height"] > 200 and plot["marks"] > 0, plot
    bars = next(p for p in plots if p["title"] == "primary metric per task, by stage")
    scored = [runs.get(name).metrics for name in ("pretrain-demo", "sft-demo", dpo.name)]
    assert all("facts/acc" in m and "instruct/exact_match" in m for m in scored)
    assert bars["marks"] == sum(len(primary_scores(m)) for m in scored)  # a bar per stage and task

    shot = tmp_path / "report.png"
    done = _chromium([f"--screenshot={shot}", "--window-size=1200,2400", path.as_uri()], tmp_path / "profile-png")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "report.png")
    assert shot.stat().st_size > 50_000
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2400)
    colors = image.getcolors(maxcolors=1 << 20)
    assert len(colors) > 100  # text, plots, anti-aliasing: far from a blank page

    def pixels_near(rgb: tuple[int, int, int]) -> int:
        return sum(n for n, c in colors if sum((a - b) ** 2 for a, b in zip(c, rgb)) < 40 ** 2)

    assert pixels_near((0x1F, 0x77, 0xB4)) > 2000  # the first series' blue: bars, curves, legends
    assert pixels_near((0xFF, 0x7F, 0x0E)) > 500   # the second series' orange


def test_compare_and_report_commands(chain):
    from smolforge.cli import main

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--runs-dir", str(chain.root), "compare", "sft-x", "dpo-x"]) == 0
    assert out.getvalue().splitlines()[0].split() == ["figure", "sft-x", "dpo-x"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--runs-dir", str(chain.root), "report", "dpo-x"]) == 0
    written = Path(out.getvalue().strip())
    assert written == chain.root / "dpo-x" / "report.html" and "<svg" in written.read_text()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["--runs-dir", str(chain.root), "compare", "dpo-y"]) == 2
    assert "RunError: unknown run 'dpo-y' (did you mean 'dpo-x'?)" in err.getvalue()
