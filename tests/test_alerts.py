"""Live alerts on a real Prometheus (Debian's package, on 127.0.0.1): promtool accepts the shipped
rules, and a pretraining run made to misbehave (a phase of random-string noise after a clean text
it has learned) fires the gradient-norm alert while Prometheus scrapes it."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import QUIET, run_stage
from smolforge.prometheus import alert_rules_path, dashboard_path
from smolforge.processes import free_port, stop_group, wait_until_ready

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="needs Debian's prometheus package (make setup installs it)")


def test_promtool_accepts_the_shipped_rules():
    checked = subprocess.run(["promtool", "check", "rules", str(alert_rules_path())], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout


def test_the_logprob_gap_alert_fires_on_the_step_the_engine_falls_off_the_policy(tmp_path):
    """promtool's rule unit test: the gap gauge at 1e-7 for two minutes, then 0.09 (a skipped weight sync,
    as tests/test_vllm_rollouts.py measures it) fires SmolforgeLogprobGap at once, and only then."""
    tests = tmp_path / "parity-test.yml"
    tests.write_text(json.dumps({
        "rule_files": [str(alert_rules_path())], "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": 'smolforge_train_parity_logprob_gap_mean{run="grpo-demo"}',
                                     "values": "0.0000001 0.0000001 0.09 0.09"}],
                   "alert_rule_test": [
                       {"eval_time": "1m", "alertname": "SmolforgeLogprobGap", "exp_alerts": []},
                       {"eval_time": "2m", "alertname": "SmolforgeLogprobGap",
                        "exp_alerts": [{"exp_labels": {"severity": "critical", "run": "grpo-demo"},
                                        "exp_annotations": {
                                            "summary": "grpo-demo: the inference engine and the trainer disagree by "
                                                       "0.090 nats per sampled token",
                                            "fix": next(r for g in yaml_rules() for r in g["rules"]
                                                        if r["alert"] == "SmolforgeLogprobGap")["annotations"]["fix"]}}]},
                   ]}]}))
    checked = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def yaml_rules() -> list[dict]:
    import yaml

    return yaml.safe_load(alert_rules_path().read_text())["groups"]


@pytest.fixture
def prometheus(tmp_path):
    """A Prometheus scraping 127.0.0.1:<metrics port> every 0.2 s with the shipped rules; ``(url, port)``."""
    metrics_port, port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "200ms", "evaluation_interval": "200ms"},
        "rule_files": [str(alert_rules_path())],
        "scrape_configs": [{"job_name": "smolforge", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }))
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(f"{url}/-/ready", {"prometheus": (proc, log)}, what="Prometheus", started=time.perf_counter(),
                         timeout=60)
        deadline = time.monotonic() + 30      # its scrape manager takes targets up on a 5 s tick, after ready
        while not get(url, "/api/v1/targets")["activeTargets"]:
            assert time.monotonic() < deadline, "Prometheus never took up the scrape target"
            time.sleep(0.2)
        yield url, metrics_port
    finally:
        stop_group(proc, grace=10)


def get(url: str, path: str) -> dict:
    with urllib.request.urlopen(f"{url}{path}", timeout=10) as reply:
        return json.loads(reply.read())["data"]


def query(url: str, expr: str, start: float, end: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "0.2"})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=10) as reply:
        return json.loads(reply.read())["data"]["result"]


def test_a_misbehaving_run_fires_the_gradient_norm_alert(runs, prometheus, spiky_data, monkeypatch):
    from smolforge.pretrain.mixture import MixtureSampler

    url, metrics_port = prometheus
    next_batch = MixtureSampler.next_batch

    def slowed(self, step):
        # ~0.08 s a step, and 1 s before steps 32 and 33: the grad-norm gauge of the two noise steps
        # that jump (the model adapts by the third) stays up for several 0.2 s scrape+evaluation
        # rounds, even on a loaded machine where one round can slip past a 0.1 s step
        time.sleep(1.0 if step in (32, 33) else 0.08)
        return next_batch(self, step)

    monkeypatch.setattr(MixtureSampler, "next_batch", slowed)
    began = time.time()
    run = run_stage("pretrain", runs, name="pretrain-alerted", data="data-spiky",
                    mixture=[{"until": 0.75, "weights": {"clean": 1.0}},          # steps 1-30: learnable text
                             {"until": 1.0, "weights": {"clean": 0.0, "noise": 1.0}}],   # 31-40: noise
                    train={"max_steps": 40, "log_every": 1, "learning_rate": 1e-2, "warmup_steps": 2},
                    spike={"action": "off"}, checkpoint={"every_steps": 0},
                    tracking={**QUIET["tracking"], "prometheus_port": metrics_port})
    ended = time.time()
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    fault = next(line["time"] for line in lines if line.get("step") == 31)
    fired = query(url, 'ALERTS{alertname="SmolforgeGradNormJump",alertstate="firing"}', began, ended + 1)
    assert fired, "the gradient-norm alert never fired"
    assert fired[0]["metric"]["run"] == "pretrain-alerted" and fired[0]["metric"]["severity"] == "warning"
    first = min(float(t) for series in fired for t, _ in series["values"])
    assert fault - 0.5 <= first <= fault + 5      # fired within seconds of the first noise batch
    print(f"\nSmolforgeGradNormJump fired {first - fault:.2f} s after the fault (step 31); labels {fired[0]['metric']}")
    calm = query(url, 'ALERTS{alertname="SmolforgeGradNormJump"}', began, fault - 1.0)
    assert calm == []                              # nothing before the fault
    dashboard = json.loads(dashboard_path().read_text())
    for panel in dashboard["panels"]:              # every panel's query is valid PromQL for this Prometheus
        expr = panel["targets"][0]["expr"].replace("$run", "pretrain-alerted")
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
            assert json.loads(r.read())["status"] == "success", panel["title"]
