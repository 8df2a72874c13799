"""`smolforge doctor`: the playbook's troubleshooting table applied to a run's metrics.

Each rule is checked on hand-made metric lists (a healthy run yields nothing; each symptom yields
exactly its finding with the right steps), then on real tiny pretraining runs that show the
symptoms: a loader slowed for a few steps, a mixture phase of corrupted data, an LR so high the
loss turns NaN, and a healthy run beside them.
"""
from __future__ import annotations

import json
import math
import random
import statistics
import time

import pytest

from conftest import QUIET, run_stage
from smolforge.cli import main
from smolforge.errors import RunError
from smolforge.pretrain import batches as pretrain_batches
from smolforge.ops.doctor import (CHECKS, Finding, NotChecked, diagnose, divergence, grad_norm, loss_noise,
                                       memory, read_records, throughput, utilisation)

MIXTURE = [{"until": 0.6, "weights": {"web": 1.0}},                    # steps 1-24
           {"until": 0.8, "weights": {"web": 0.5, "scraped": 0.5}},     # steps 25-32
           {"until": 1.0, "weights": {"web": 1.0}}]                     # steps 33-40
INFO = {"name": "hand-made", "stage": "pretrain", "status": "done",
        "recipe": {"data": "data-web", "mixture": MIXTURE,
                   "train": {"max_steps": 40, "learning_rate": 0.003, "warmup_steps": 20, "grad_clip": 1.0,
                             "micro_batch_size": 16, "grad_accum": 1, "zero_stage": 2, "precision": "bf16",
                             "activation_checkpointing": False, "offload_optimizer": False}},
        "metrics": {"train/device_memory_gb": 80.0, "train/processes": 1,
                    "train/mix/phase1/web": 0.51, "train/mix/phase1/scraped": 0.49}}


def healthy_rows(n: int = 40, seed: int = 0) -> list[dict]:
    """A run that goes well: the loss falls with a little noise, steady speed, grad norm and memory."""
    rng = random.Random(seed)
    return [{"step": s, "time": 1000.0 + s, "loss": round(3.0 * 0.97 ** s + 1.0 + rng.gauss(0, 0.01), 5),
             "lr": 0.003, "grad_norm": round(0.5 + rng.gauss(0, 0.03), 5), "tokens": s * 4096,
             "tokens_per_s": round(10_000 * (1 + rng.gauss(0, 0.03)), 1), "mfu": 0.3, "memory_gb": 40.0,
             "data_s": 0.008, "data_share": 0.02} for s in range(1, n + 1)]


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [(f.check, f.steps, f.evidence) for f in findings]
    return findings[0]


# -- each rule on hand-made metrics --------------------------------------------------------------
def test_a_healthy_run_has_no_findings_and_every_check_ran():
    diagnosis = diagnose(healthy_rows(), INFO)
    assert diagnosis.findings == [] and diagnosis.healthy
    assert diagnosis.not_checked == {} and diagnosis.steps == (1, 40)


def test_a_slowed_loader_is_a_data_loading_bottleneck():
    rows = healthy_rows()
    for row in rows[19:25]:                                    # steps 20-25: 4x slower, waiting for data
        row.update(tokens_per_s=2_500.0, data_s=0.3, data_share=0.75)
    finding = only(diagnose(rows, INFO).findings)
    assert (finding.check, finding.steps) == ("throughput", (20, 25))
    assert finding.cause == "data loading bottleneck (confirmed by the data wait)"
    assert ("waiting for batches 75 % of the time against 2 % before, which explains 99 % of the slowdown"
            in finding.evidence)
    assert "loader workers, prefetch" in finding.fix


def test_a_slowdown_the_data_wait_does_not_explain_is_not_blamed_on_the_loader():
    rows = healthy_rows()
    for row in rows[19:25]:                                    # as slow, but the wait for data stays put
        row.update(tokens_per_s=2_500.0, data_share=0.02)
    finding = only(throughput(rows))
    assert finding.steps == (20, 25) and finding.cause == "not the data loader: compute or communication slowed"
    assert "waiting for batches 2 % of the time against 2 % before, which explains 2 % of the slowdown" \
        in finding.evidence


def test_a_loader_stall_that_runs_into_a_slowdown_of_another_kind_is_two_findings():
    """Steps 20-22 wait for data, steps 23-26 are slowed by something else (another job): one stretch
    below the median, two causes; once blamed as a whole on neither (the data wait explained half)."""
    rows = healthy_rows()
    for row in rows[19:22]:
        row.update(tokens_per_s=2_500.0, data_s=0.3, data_share=0.75)
    for row in rows[22:26]:
        row.update(tokens_per_s=4_000.0, data_share=0.02)
    stall, other = throughput(rows)
    assert (stall.steps, stall.cause) == ((20, 22), "data loading bottleneck (confirmed by the data wait)")
    assert (other.steps, other.cause) == ((23, 26), "not the data loader: compute or communication slowed")
    assert "tokens/s 2,500 over steps 20-22" in stall.evidence and ", 3 s of wall time" in stall.evidence
    assert ", 4 s of wall time" in other.evidence                # from step 22 on, not from before the stall
    for row in rows[19:26]:                                      # causes alternating window by window: no part
        row.update(tokens_per_s=2_500.0, data_share=0.75 if row["step"] % 2 else 0.02)   # is 2 long, one stretch
    assert only(throughput(rows)).steps == (20, 26)


def test_without_a_logged_data_wait_the_loader_is_only_the_likely_cause():
    rows = healthy_rows()
    for row in rows:
        del row["data_s"], row["data_share"]
    for row in rows[19:25]:
        row["tokens_per_s"] = 2_500.0
    finding = only(throughput(rows))
    assert finding.cause == "data loading bottleneck (likely)" and "does not log its wait" in finding.evidence


def test_one_slow_window_a_checkpoint_write_is_not_a_throughput_drop():
    rows = healthy_rows()
    rows[19]["tokens_per_s"] = 2_000.0
    assert throughput(rows) == []
    rows[20]["tokens_per_s"] = 2_000.0                         # two in a row are
    assert only(throughput(rows)).steps == (20, 21)


def test_a_noisier_loss_names_its_steps_and_the_mixture_phase_to_inspect():
    rows = healthy_rows()
    for row in rows[24:32]:                                    # steps 25-32: every other batch far off
        row["loss"] += 0.9 if row["step"] % 2 else 0.0
    finding = only(diagnose(rows, INFO).findings)
    assert (finding.check, finding.symptom) == ("loss_noise", "loss curve got noisier")
    assert finding.steps == (25, 31)
    assert "at 4 of 7 logged steps in 25-31" in finding.evidence
    assert finding.fix.startswith("inspect the batches of steps 25-31: mixture phase 1 (steps 25-32, weights "
                                  "web 0.5, scraped 0.5; realised scraped 49 %, web 51 %), which begins at step 25 "
                                  "(data run 'data-web')")
    assert finding.cause == "a shift in the data (its quality or its mix)"


def test_a_single_loud_loss_is_a_spike_not_a_noisier_curve():
    rows = healthy_rows()
    rows[29]["loss"] *= 2
    finding = only(loss_noise(rows, [], INFO))
    assert (finding.symptom, finding.steps) == ("loss spike", (30, 30))


def test_a_nan_loss_is_numerical_instability_and_the_fix_cites_the_recipe():
    rows = healthy_rows()
    for row in rows[29:]:
        row.update(loss=float("nan"), grad_norm=float("nan"))
    finding = only(diagnose(rows, INFO).findings)
    assert (finding.check, finding.symptom, finding.steps) == ("divergence", "training crashed / NaN", (30, 40))
    assert finding.evidence.startswith("loss nan at step 30 (first non-finite value)")
    assert finding.cause == "numerical instability"
    for cited in ("keep gradient clipping on (train.grad_clip 1.0)", "train.learning_rate 0.003; try 0.00075",
                  "train.warmup_steps 20", "bf16 needs none"):
        assert cited in finding.fix


def test_a_failed_run_whose_error_says_nan_is_numerical_instability():
    info = {**INFO, "status": "failed", "error": "RuntimeError: loss became nan at step 7: lower train.learning_rate"}
    finding = only(divergence(healthy_rows(6), [], info))
    assert finding.steps == (7, 7) and "the run failed: RuntimeError: loss became nan at step 7" in finding.evidence
    assert divergence(healthy_rows(6), [], {**info, "error": "ConnectionError: peer lost"}) == []


def test_memory_above_90_percent_of_the_device_is_found_with_the_total_from_the_run_or_the_option():
    rows = healthy_rows()
    for row in rows[29:]:
        row["memory_gb"] = 75.0                                # 94 % of the 80 GB the run recorded
    finding = only(diagnose(rows, INFO).findings)
    assert (finding.check, finding.steps) == ("memory", (30, 40))
    assert "memory_gb up to 75 of 80 GB (94 %)" in finding.evidence
    assert "train.activation_checkpointing: true" in finding.fix and "train.zero_stage 3; now 2" in finding.fix
    assert "train.micro_batch_size 16 -> 8 and train.grad_accum 1 -> 2" in finding.fix
    unknown = {**INFO, "metrics": {}}
    assert "memory" in diagnose(rows, unknown).not_checked
    assert memory(rows, unknown, device_memory_gb=141) == []     # an H200 holds it
    assert only(memory(rows, unknown, device_memory_gb=80)).steps == (30, 40)


def test_an_out_of_memory_failure_is_a_memory_finding_even_without_a_device_total():
    info = {**INFO, "metrics": {}, "status": "failed", "error": "torch.OutOfMemoryError: CUDA out of memory."}
    finding = only(memory(healthy_rows(5), info))
    assert finding.symptom == "out of memory" and "CUDA out of memory" in finding.evidence


def test_grad_norm_jumps_of_3x_are_named_with_the_spike_guard_events():
    rows = healthy_rows()
    rows[19]["grad_norm"] = 1.7                                # 3.4x the ~0.5 before
    rows[20]["grad_norm"] = 1.2                                # 2.4x: below the alert
    spike = {"step": 27, "event": "spike", "reason": "grad norm 1.7 > 3.0x rolling median 0.5", "action": "logged"}
    finding = only(diagnose(rows + [spike], INFO).findings)
    assert (finding.check, finding.steps) == ("grad_norm", (20, 27))
    assert finding.evidence.startswith("grad norm 1.7 at step 20 (3.")
    assert "spike guard logged grad-norm spikes at step(s) 27 (action: logged)" in finding.evidence
    assert "check the batches of steps 20, 27" in finding.fix and "train.grad_clip 1.0" in finding.fix
    assert grad_norm(healthy_rows(), [], INFO) == []


@pytest.mark.parametrize(("processes", "share", "cause"), [
    (8, 0.02, "communication waits"),
    (8, 0.40, "data loading bottleneck"),
])
def test_low_mfu_is_communication_waits_when_the_data_wait_is_small(processes, share, cause):
    rows = healthy_rows()
    for row in rows:
        row.update(mfu=0.04, data_share=share)
    info = {**INFO, "metrics": {**INFO["metrics"], "train/processes": processes}}
    finding = only(diagnose(rows, info).findings)
    assert (finding.check, finding.steps, finding.cause) == ("utilisation", (2, 40), cause)
    assert finding.evidence.startswith(f"median MFU 4 % over steps 2-40 (below 10 %; SmolLM3 ran at ~26-31 %); "
                                       f"waiting for batches {share * 100:.0f} % of the time")
    assert utilisation(rows, info, min_mfu=0.03) == []


def test_low_mfu_on_one_process_is_not_blamed_on_communication():
    rows = healthy_rows()
    for row in rows:
        row["mfu"] = 0.04
    diagnosis = diagnose(rows, INFO)
    assert diagnosis.findings == []
    assert diagnosis.not_checked["utilisation"].startswith("median MFU 4 % with one process and a small wait for "
                                                           "data: no communication to wait on")


def test_checks_without_their_inputs_say_why():
    rows = [{"step": s, "loss": 2.0 - 0.01 * s, "grad_norm": 1.0, "learning_rate": 1e-5} for s in range(1, 4)]
    diagnosis = diagnose(rows, {"stage": "sft", "status": "done", "recipe": {"trainer": {"learning_rate": 1e-5}}})
    assert diagnosis.findings == []
    assert set(diagnosis.not_checked) == {"memory", "throughput", "loss_noise", "grad_norm", "utilisation"}
    assert "pass --device-memory GB" in diagnosis.not_checked["memory"]
    with pytest.raises(NotChecked, match="3 losses logged; needs 8"):
        loss_noise(rows, [], {})


def test_a_cut_last_line_is_skipped_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": NaN}\n{"step": 2, "lo')
    [record] = read_records(path)
    assert math.isnan(record["loss"])
    path.write_text('{"step": 1, "loss": 2.0}\nnot json\n{"step": 3, "loss": 1.0}\n')
    with pytest.raises(RunError, match="metrics.jsonl line 2: not a JSON object"):
        read_records(path)


# -- real runs that show the symptoms --------------------------------------------------------------
TRAIN = {"max_steps": 12, "log_every": 1, "warmup_steps": 2}
SLOW_STEPS = range(6, 9)                                        # the loader stalls here


def doctor(capsys, runs, *args: str) -> tuple[int, str]:
    """``smolforge doctor ARGS``: its exit code and what it printed (stdout, then stderr)."""
    capsys.readouterr()                                        # not what training printed before
    code = main(["--runs-dir", str(runs.root), "doctor", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def doctor_json(capsys, runs, name: str) -> dict:
    code, out = doctor(capsys, runs, name, "--json")
    assert code == 0, out
    return json.loads(out)


def but_contention(findings: list[dict]) -> list[dict]:
    """The findings, less throughput drops the run's own data wait rules out: on a shared machine
    (the test workers, other jobs) another process can slow a run for a few steps, and the doctor
    rightly reports that as "not the data loader"."""
    return [f for f in findings if not (f["check"] == "throughput" and f["cause"].startswith("not the data loader"))]


@pytest.fixture(scope="module")
def healthy_run(runs, data_run):
    return run_stage("pretrain", runs, name="doctor-healthy", train=TRAIN, checkpoint={"every_steps": 0}, **QUIET)


@pytest.fixture(scope="module")
def slow_loader_run(runs, data_run):
    """The healthy recipe with a loader that stalls over SLOW_STEPS: each batch there waits 3x as
    long as a whole step took before (at least 0.3 s), so the drop shows on a busy machine too."""
    real = pretrain_batches.micro_batches
    started: list[float] = []                                  # when each step asked for its batches

    def stalling(*args, **kwargs):
        started.append(time.perf_counter())                    # one call per step (one process, no resume)
        if len(started) in SLOW_STEPS:
            before = started[1:SLOW_STEPS[0] - 1]              # steps 2-5 (step 1 holds the start-up)
            time.sleep(max(0.3, 3 * statistics.median(b - a for a, b in zip(before, before[1:]))))
        yield from real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pretrain_batches, "micro_batches", stalling)
        return run_stage("pretrain", runs, name="doctor-slow-loader", train=TRAIN, checkpoint={"every_steps": 0},
                         **QUIET)


CORRUPTED = [{"until": 0.5, "weights": {"clean": 1.0}},                      # steps 1-8
             {"until": 0.75, "weights": {"clean": 0.5, "noise": 0.5}},        # steps 9-12: half of it garbage
             {"until": 1.0, "weights": {"clean": 1.0}}]                       # steps 13-16


def test_a_healthy_run_says_so_and_exits_0(capsys, runs, healthy_run):
    report = doctor_json(capsys, runs, healthy_run.name)
    assert but_contention(report["findings"]) == [], report["findings"]
    assert set(report["not_checked"]) <= {"utilisation"}       # one process: no communication to wait on
    logged = [r for r in read_records(healthy_run.metrics_path) if "loss" in r]
    assert all(0 <= r["data_share"] <= 1 and r["data_s"] >= 0 for r in logged)   # the loop logs its data wait
    assert healthy_run.metrics["train/device_memory_gb"] > 0
    assert set(report["checked"]) | set(report["not_checked"]) == set(CHECKS)
    code, out = doctor(capsys, runs, healthy_run.name, "--strict")          # the table, and CI's exit code
    assert code == (1 if report["findings"] else 0), out
    found = len(report["findings"])
    assert out.startswith("doctor-healthy: pretrain run, done, steps 1-12: "
                          + (f"{found} finding" if found else "healthy, no findings")), out
    assert f"checked: {', '.join(report['checked'])}" in out


def test_a_slowed_loader_is_diagnosed_as_data_loading(capsys, runs, slow_loader_run):
    report = doctor_json(capsys, runs, slow_loader_run.name)
    found = but_contention(report["findings"])
    assert len(found) == 1, json.dumps(report["findings"], indent=1)
    [finding] = found
    assert finding["check"] == "throughput"
    assert finding["cause"] == "data loading bottleneck (confirmed by the data wait)"
    # the stalled steps, exactly on a quiet machine (a neighbour's load can slow a step beside them too)
    first, last = finding["steps"]
    assert first <= SLOW_STEPS[0] and last >= SLOW_STEPS[-1] and last - first < 2 * len(SLOW_STEPS), finding
    assert finding["figures"]["data_share"] > 0.5 > finding["figures"]["data_share_before"]
    code, out = doctor(capsys, runs, slow_loader_run.name, "--strict")
    assert code == 1 and "throughput dropped suddenly" in out and "loader workers, prefetch" in out


def test_a_corrupted_data_phase_is_diagnosed_as_a_data_shift_in_that_phase(capsys, runs, spiky_data):
    run_stage("pretrain", runs, name="doctor-corrupted", data=spiky_data.name, mixture=CORRUPTED,
              train={**TRAIN, "max_steps": 16, "learning_rate": 1e-2}, checkpoint={"every_steps": 0},
              spike={"action": "skip", "min_history": 4, "window": 5}, **QUIET)
    findings = but_contention(doctor_json(capsys, runs, "doctor-corrupted")["findings"])
    [finding] = [f for f in findings if f["check"] == "loss_noise"]
    assert finding["symptom"] == "loss curve got noisier" and 9 <= finding["steps"][0] < finding["steps"][1] <= 12
    assert len(finding["figures"]["loud_steps"]) >= 2, finding
    assert "mixture phase 1 (steps 9-12, weights clean 0.5, noise 0.5; realised " in finding["fix"]
    assert "data run 'data-spiky'" in finding["fix"]
    assert {f["check"] for f in findings} <= {"loss_noise", "grad_norm"}   # bad batches move gradients too


def test_an_lr_far_too_high_is_diagnosed_as_numerical_instability(capsys, runs, data_run):
    with pytest.raises(RuntimeError, match="loss became nan"):
        run_stage("pretrain", runs, name="doctor-lr-too-high", train={**TRAIN, "learning_rate": 1000.0},
                  checkpoint={"every_steps": 0}, spike={"action": "off"}, **QUIET)
    report = doctor_json(capsys, runs, "doctor-lr-too-high")
    assert report["status"] == "failed"
    [finding] = [f for f in report["findings"] if f["check"] == "divergence"]
    assert finding["cause"] == "numerical instability" and "the run failed: " in finding["evidence"]
    assert "train.learning_rate 1000.0; try 250" in finding["fix"] and "train.warmup_steps 2" in finding["fix"]


def test_an_unknown_run_is_a_run_error_naming_the_close_match(capsys, runs, healthy_run):
    code, out = doctor(capsys, runs, "doctor-healthyy")
    assert code == 2 and out.startswith("RunError: run 'doctor-healthyy' not found") and "did you mean" in out
