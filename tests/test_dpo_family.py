"""DPO's loss variants, reference handling and LoRA, the ORPO stage, and the bad input they refuse."""
from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from conftest import DEMO, run_stage, tiny_recipe
from smolforge.errors import DataError, RecipeError
from smolforge.recipe import build_stage_recipe, deep_merge, load_recipe
from smolforge.registry import load_stage

# The ORPO demo recipe shrunk like conftest's TINY shrinks the DPO one.
TINY_ORPO = {"trainer": {"max_steps": 3, "per_device_train_batch_size": 8, "max_length": 64, "logging_steps": 1}}
FEW = {"max_steps": 3}  # runs that only show a setting reaches TRL


def logged(run, key):
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    return [m[key] for m in lines if key in m]


def plain_model(run):
    from transformers import AutoModelForCausalLM

    files = {p.name for p in run.model_dir.iterdir()}
    assert "model.safetensors" in files and not any(f.startswith("adapter_") for f in files)
    return AutoModelForCausalLM.from_pretrained(run.model_dir)


def differs(model, other) -> bool:
    a, b = model.state_dict(), other.state_dict()
    assert a.keys() == b.keys()  # same plain architecture: no lora_A/lora_B left behind
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_sigmoid_plus_sft_loss_adds_the_chosen_nll_and_raises_the_margin(dpo_run):
    assert dpo_run.info["recipe"]["trainer"]["loss_type"] == ["sigmoid", "sft"]
    losses, margins = logged(dpo_run, "loss"), logged(dpo_run, "rewards/margins")
    # step 1: policy == reference, so the sigmoid term is exactly ln 2 and the rest is the chosen NLL
    assert losses[0] > math.log(2) + 0.05
    assert margins[-1] > margins[0]


def test_ipo_loss_reaches_trl(runs, sft_run):
    run = run_stage("dpo", runs, name="dpo-ipo", trainer={**FEW, "loss_type": "ipo", "loss_weights": None, "beta": 0.25})
    assert run.info["recipe"]["trainer"]["loss_type"] == ["ipo"]
    # IPO at step 1 (zero log-ratios): (0 - 1 / (2 beta))^2
    assert logged(run, "loss")[0] == pytest.approx((1 / (2 * 0.25)) ** 2, rel=1e-3)
    assert "train/margins" in run.metrics and len(logged(run, "rewards/margins")) == 3


@pytest.mark.parametrize("loss_type", ["apo_zero", "apo_down"])
def test_apo_loss_is_the_papers_on_the_logged_log_ratios(runs, data_run, sft_run, pretrain_run, loss_type):
    """recipes/demo/apo.yaml through TRL: step 1's loss on one pair, before any update, against the
    APO paper's eqs. (7) and (8) on the rewards TRL logged for that pair (beta x log-ratio); the
    reference is another model, so the log-ratios are not zero."""
    _, data = load_recipe(DEMO / "apo.yaml")
    data = deep_merge(data, {"name": f"dpo-{loss_type}", "parent": sft_run.name, "data": data_run.name,
                             "reference": f"run:{pretrain_run.name}",
                             "trainer": {"max_steps": 1, "per_device_train_batch_size": 1,
                                         "gradient_accumulation_steps": 1, "logging_steps": 1,
                                         "max_length": 64, "loss_type": loss_type,
                                         "bf16": False}})   # fp32 on a GPU too: the check is to 1e-4
    stage = load_stage("dpo")
    recipe = build_stage_recipe(stage, data, source="apo.yaml (test)")
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs, overwrite=True)
    assert run.info["recipe"]["trainer"]["loss_type"] == [loss_type]
    [chosen], [rejected], [loss] = logged(run, "rewards/chosen"), logged(run, "rewards/rejected"), logged(run, "loss")
    assert abs(chosen) > 1e-3 and abs(rejected) > 1e-3
    sig = torch.sigmoid
    chosen_t, rejected_t = torch.tensor(chosen, dtype=torch.float64), torch.tensor(rejected, dtype=torch.float64)
    expected = ((1 - sig(chosen_t)) + sig(rejected_t) if loss_type == "apo_zero"       # eq. (7)
                else sig(chosen_t) + (1 - sig(chosen_t - rejected_t)))                 # eq. (8)
    assert loss == pytest.approx(float(expected), rel=1e-4, abs=1e-5)
    other = ((1 - sig(chosen_t)) + sig(rejected_t) if loss_type == "apo_down" else sig(chosen_t) + (1 - sig(chosen_t - rejected_t)))
    assert abs(float(other) - loss) > 1e-4      # the two losses differ here: the test tells them apart


def test_precomputed_reference_log_probs_load_no_reference_model(runs, sft_run, monkeypatch):
    from transformers import AutoModelForCausalLM

    loads, original = [], AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda path, *a, **k: (loads.append(str(path)), original(path, *a, **k))[1])
    run = run_stage("dpo", runs, name="dpo-precomputed",
                    trainer={**FEW, "precompute_ref_log_probs": True, "loss_type": "sigmoid",
                                             "loss_weights": None})
    assert loads == [str(sft_run.model_dir)]  # the policy only; TRL precomputes with it before step 1
    assert logged(run, "loss")[0] == pytest.approx(math.log(2), abs=1e-3)  # reference == untrained policy
    assert run.info["status"] == "done"


def test_explicit_reference_run_is_the_one_compared_against(runs, sft_run, pretrain_run):
    run = run_stage("dpo", runs, name="dpo-ref-pretrain", reference=f"run:{pretrain_run.name}",
                    trainer={**FEW, "precompute_ref_log_probs": True})
    assert run.info["recipe"]["reference"] == f"run:{pretrain_run.name}"
    assert run.info["parents"][0] == sft_run.name and run.info["parents"][-1] == pretrain_run.name  # lineage
    chosen = logged(run, "rewards/chosen")
    assert abs(chosen[0]) > 1e-3  # step 1 already differs: the reference is not the policy's parent


def test_lora_dpo_saves_a_merged_plain_model(runs, sft_run):
    from transformers import AutoModelForCausalLM

    run = run_stage("dpo", runs, name="dpo-lora", reference="none", lora={"r": 8, "alpha": 16},
                    trainer={**FEW, "learning_rate": 1e-3})
    assert run.info["recipe"]["lora"]["r"] == 8
    assert (run.path / "adapter" / "adapter_config.json").is_file()  # the adapter is kept beside model/
    assert logged(run, "loss")[0] > math.log(2)  # the implicit reference (adapter off) equals the policy at step 1
    model = plain_model(run)
    assert type(model).__name__ == "SmolLM3ForCausalLM"
    assert differs(model, AutoModelForCausalLM.from_pretrained(sft_run.model_dir))


def test_reference_none_without_lora_is_refused(runs, sft_run):
    recipe = tiny_recipe("dpo", reference="none")
    with pytest.raises(RecipeError, match="reference: none needs lora:"):
        load_stage("dpo").validate(recipe, runs)


def test_misspelled_reference_suggests_parent(runs, sft_run):
    with pytest.raises(RecipeError, match="did you mean 'parent'"):
        load_stage("dpo").validate(tiny_recipe("dpo", reference="parnet"), runs)


def test_unknown_loss_type_names_the_closest_trl_loss(runs, sft_run):
    recipe = tiny_recipe("dpo", trainer={"loss_type": ["sigmoid", "sfft"], "loss_weights": [1.0, 0.5]})
    with pytest.raises(RecipeError, match=r"unknown DPO loss 'sfft' \(did you mean 'sft'\?\)"):
        load_stage("dpo").validate(recipe, runs)


def test_robust_loss_needs_a_flip_probability_below_one_half(runs, sft_run):
    recipe = tiny_recipe("dpo", trainer={"loss_type": "robust", "loss_weights": None, "label_smoothing": 0.6})
    with pytest.raises(RecipeError, match=r"label_smoothing must be in \[0, 0.5\)"):
        load_stage("dpo").validate(recipe, runs)


def test_beta_zero_is_refused(runs, sft_run):
    with pytest.raises(RecipeError, match="trainer.beta must be > 0, got 0"):
        load_stage("dpo").validate(tiny_recipe("dpo", trainer={"beta": 0}), runs)


def test_beta_outside_the_playbook_range_warns(runs, sft_run, caplog):
    with caplog.at_level(logging.WARNING, logger="smolforge.alignment.dpo"):
        load_stage("dpo").validate(tiny_recipe("dpo", trainer={"beta": 0.5}), runs)
    assert "trainer.beta=0.5 is outside the playbook's 0.1-0.3 range" in caplog.text


def test_empty_answer_in_a_conversational_pair_names_file_and_line(tmp_path, runs, sft_run):
    def pair(chosen, rejected):
        return json.dumps({"prompt": [{"role": "user", "content": "What is 2 plus 2?"}],
                           "chosen": [{"role": "assistant", "content": chosen}],
                           "rejected": [{"role": "assistant", "content": rejected}]})

    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(pair("4.", "5.") + "\n" + pair("4.", "  ") + "\n")
    for stage in ("dpo", "orpo"):
        recipe = orpo_recipe(data=str(prefs)) if stage == "orpo" else tiny_recipe("dpo", data=str(prefs))
        with pytest.raises(DataError, match=rf"{prefs} line 2: field 'rejected\[0\].content' is empty"):
            load_stage(stage).validate(recipe, runs)


def orpo_recipe(**changes):
    _, data = load_recipe(DEMO / "orpo.yaml")
    return build_stage_recipe(load_stage("orpo"), deep_merge(deep_merge(data, TINY_ORPO), changes), "orpo (test)")


def test_orpo_trains_without_a_reference_and_writes_a_plain_model(runs, sft_run, data_run):
    from transformers import AutoModelForCausalLM

    stage = load_stage("orpo")
    recipe = orpo_recipe(parent=sft_run.name, data=data_run.name)
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs, overwrite=True)
    assert run.info["stage"] == "orpo" and run.info["parents"] == [sft_run.name, data_run.name]
    assert len(logged(run, "log_odds_ratio")) == 3
    assert {"train/accuracies", "train/margins", "train/nll_loss", "train/log_odds_ratio"} <= set(run.metrics)
    assert differs(plain_model(run), AutoModelForCausalLM.from_pretrained(sft_run.model_dir))


def test_orpo_beta_zero_is_refused(runs, sft_run):
    with pytest.raises(RecipeError, match="trainer.beta must be > 0"):
        load_stage("orpo").validate(orpo_recipe(trainer={"beta": 0.0}), runs)


# ------------------------------------------------------------------------------------------------- KTO


def feedback_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


ASK = [{"role": "user", "content": "What does Bo eat?"}]
OTHER = [{"role": "user", "content": "Add 2 and 3."}]


def test_kto_loss_is_the_papers_on_the_logged_rewards_and_kl(runs, sft_run, tmp_path, monkeypatch):
    """Unpaired feedback in trl-lib/kto-mix-14k's layout, one desirable and one undesirable answer: step 2's
    loss (after one update, so the log-ratios are not zero) against the KTO paper's eq. (7) on what TRL
    logged for that batch: λ_D(1 − σ(β r_D − β z₀)) and λ_U(1 − σ(β z₀ − β r_U)), averaged."""
    data = feedback_rows(tmp_path / "feedback.jsonl", [
        {"prompt": ASK, "completion": [{"role": "assistant", "content": "Bo eats rice."}], "label": True},
        {"prompt": OTHER, "completion": [{"role": "assistant", "content": "Bo eats seven."}], "label": False}])
    run = run_stage("kto", runs, name="kto-formula", parent=sft_run.name, data=data,
                    trainer={"max_steps": 2, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
                             "logging_steps": 1, "learning_rate": 1e-3, "max_length": 64, "beta": 0.1,
                             "desirable_weight": 1.0, "undesirable_weight": 1.5, "warmup_steps": 0, "bf16": False})
    chosen, rejected = logged(run, "rewards/chosen")[1], logged(run, "rewards/rejected")[1]
    kl, loss = logged(run, "kl")[1], logged(run, "loss")[1]
    assert abs(chosen) > 1e-3 and abs(rejected) > 1e-3          # the policy moved from its reference
    sig = lambda x: 1 / (1 + math.exp(-x))                       # noqa: E731
    expected = (1.0 * (1 - sig(chosen - 0.1 * kl)) + 1.5 * (1 - sig(0.1 * kl - rejected))) / 2
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert logged(run, "loss")[0] == pytest.approx((1.0 * 0.5 + 1.5 * 0.5) / 2, abs=1e-4)   # step 1: r = z₀ = 0
    assert {"train/chosen", "train/rejected", "train/kl"} <= set(run.metrics)
    # packing: true (answers, KL rows and the reference's forwards as one document-masked row): the same
    # figures step for step, to 1e-5 in fp32
    from smolforge.alignment import packed_preference

    packs = []
    pack = packed_preference.pack
    monkeypatch.setattr(packed_preference, "pack", lambda *args: packs.append(args[1].shape) or pack(*args))
    packed = run_stage("kto", runs, name="kto-formula-packed", parent=sft_run.name, data=data, packing=True,
                       trainer=run.info["recipe"]["trainer"])
    assert len(packs) >= 2 * 3 and all(shape[0] == 2 for shape in packs)  # policy and reference, answers and KL rows
    for key in ("loss", "rewards/chosen", "rewards/rejected", "kl"):
        assert logged(packed, key) == pytest.approx(logged(run, key), abs=1e-5, rel=1e-5), key


def test_feedback_rows_are_checked_and_pairs_become_two_rows(tmp_path, runs, sft_run):
    from smolforge.data.schemas import load_rows

    pairs = feedback_rows(tmp_path / "pairs.jsonl", [{"prompt": "Q?", "chosen": "Good.", "rejected": "Bad."}])
    assert load_rows(pairs, "feedback") == [{"prompt": "Q?", "completion": "Good.", "label": True},
                                            {"prompt": "Q?", "completion": "Bad.", "label": False}]
    bad = feedback_rows(tmp_path / "bad.jsonl", [{"prompt": "Q?", "completion": "A.", "label": "yes"}])
    with pytest.raises(DataError, match=r"bad.jsonl line 1: field 'label' must be true .* found 'yes'"):
        load_rows(bad, "feedback")
    one_kind = feedback_rows(tmp_path / "good.jsonl", [{"prompt": "Q?", "completion": "A.", "label": True}] * 2)
    with pytest.raises(DataError, match=r"KTO needs both kinds of feedback: 2 rows and no undesirable"):
        load_stage("kto").validate(tiny_recipe("kto", parent=sft_run.name, data=one_kind), runs)
    assert not (runs.root / "kto-demo").exists()


def test_kto_reads_a_data_runs_feedback_kind_else_its_pairs(runs, data_run, sft_run, tmp_path, capsys):
    """kto-mix-14k-shaped feedback put through the data stage (sources: {feedback: ...}): `smolforge kto`
    on that data run trains on its data/feedback/ shards; on a data run without feedback, its prefs."""
    from smolforge.alignment.common import load_inputs
    from smolforge.data.shards import kind_files

    path = tmp_path / "kto-mix.jsonl"
    with path.open("w") as handle:   # trl-lib/kto-mix-14k's layout, one row at a time; extra columns ride along
        for i, (answer, label) in enumerate([("Bo eats rice.", True), ("Bo eats seven.", False),
                                             ("Bo eats rice, I think.", True)]):
            handle.write(json.dumps({"prompt": ASK, "completion": [{"content": answer, "role": "assistant"}],
                                     "label": label, "source": f"thumbs-{i}"}) + "\n")
    data = run_stage("data", runs, name="data-feedback", sources={"feedback": str(path)}, pack={"enabled": False},
                     tokenizer={"path": str(sft_run.model_dir)})
    assert [p.relative_to(data.path).as_posix() for p in kind_files(data.path, "feedback")] == \
        ["data/feedback/part-00000.jsonl"]
    capsys.readouterr()
    run = run_stage("kto", runs, name="kto-feedback-kind", parent=sft_run.name, data=data.name,
                    trainer={"max_steps": 1, "per_device_train_batch_size": 3, "max_length": 64,
                             "undesirable_weight": 1.5})
    assert "kto: reading data/feedback/ of data run data-feedback (3 rows)" in capsys.readouterr().err
    assert run.info["parents"] == [sft_run.name, data.name]
    assert run.info["data_fingerprints"]["feedback"] == data.info["data_fingerprints"]["data/feedback"]
    _, _, paths, rows = load_inputs("kto", tiny_recipe("kto", parent=sft_run.name, data=data_run.name), runs)
    assert paths == kind_files(data_run.path, "prefs") and len(rows) == 2 * card_rows(data_run, "prefs")


def card_rows(run, kind: str) -> int:
    return json.loads((run.path / "data_card.json").read_text())["kinds"][kind]["rows_out"]


@pytest.mark.parametrize("loss_type", ["simpo", "sigmoid"])
def test_simpo_and_cpo_losses_are_the_papers_on_the_logged_rewards(runs, data_run, sft_run, loss_type):
    """recipes/demo/simpo.yaml through TRL's CPOTrainer, one pair, step 1: SimPO's eq. 6,
    −log σ(r_w − r_l − γ) on the rewards TRL logged (β × mean log-prob), and CPO's
    −log σ(r_w − r_l) + α·NLL (β × summed log-prob); no reference model, so the rewards are not zero."""
    _, data = load_recipe(DEMO / "simpo.yaml")
    cpo = {"loss_type": "sigmoid", "cpo_alpha": 1.0, "beta": 0.1} if loss_type == "sigmoid" else {}
    data = deep_merge(data, {"name": f"cpo-{loss_type}", "parent": sft_run.name, "data": data_run.name,
                             "trainer": {"max_steps": 1, "per_device_train_batch_size": 1, "logging_steps": 1,
                                         "gradient_accumulation_steps": 1, "max_length": 64, "bf16": False, **cpo}})
    stage = load_stage("cpo")
    recipe = build_stage_recipe(stage, data, source="simpo.yaml (test)")
    stage.validate(recipe, runs)
    run = stage.run(recipe, runs, overwrite=True)
    [chosen], [rejected], [loss] = logged(run, "rewards/chosen"), logged(run, "rewards/rejected"), logged(run, "loss")
    [nll] = logged(run, "nll_loss")
    logsig = lambda x: -math.log1p(math.exp(-x))                # noqa: E731
    if loss_type == "simpo":
        expected = -logsig(chosen - rejected - 1.0)              # γ = 1.0 from the recipe
        assert nll == 0.0
    else:
        expected = -logsig(chosen - rejected) + 1.0 * nll
        assert nll > 0
    assert abs(chosen - rejected) > 1e-3
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert run.info["recipe"]["trainer"]["loss_type"] == loss_type and "train/margins" in run.metrics


# ------------------------------------------------------------------------------------------- packed DPO


def test_packed_dpo_trains_as_the_padded_one_does(runs, sft_run):
    """packing: true runs each batch as one document-masked row (alignment/packed_preference.py): the
    same losses, rewards and margins step for step as TRL's padded batches, to 1e-5 in fp32, with the
    padding gone; a forward outside training (generation) is untouched."""
    settings = {"max_steps": 3, "logging_steps": 1, "per_device_train_batch_size": 8, "bf16": False,
                "learning_rate": 1e-4, "warmup_steps": 0}
    padded = run_stage("dpo", runs, name="dpo-padded", trainer=settings)
    packed = run_stage("dpo", runs, name="dpo-packed", packing=True, trainer=settings)
    for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen"):
        ours, theirs = logged(packed, key), logged(padded, key)
        assert len(ours) == 3 and ours == pytest.approx(theirs, abs=1e-5, rel=1e-5), key
    assert abs(logged(packed, "rewards/margins")[-1]) > 1e-4     # the policy moved: steps 2 and 3 compare real figures
    assert packed.info["recipe"]["packing"] is True


def test_a_packed_row_keeps_every_document_to_itself(sft_run):
    """The tiny model's per-token log-probs of three sequences of different lengths, packed into one row,
    against each scored alone: equal to 1e-5, the gradient too."""
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from smolforge.alignment.packed_preference import add_packed_forward

    torch.manual_seed(0)
    lengths = [9, 4, 13]
    ids = torch.zeros(3, 13, dtype=torch.long)
    mask = torch.zeros(3, 13, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(5, 200, (n,))
        mask[row, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :2] = -100                                          # a two-token "prompt" is not scored

    def scored(packed: bool):
        model = AutoModelForCausalLM.from_pretrained(sft_run.model_dir, dtype=torch.float32)
        add_fused_lm_head(model)
        if packed:
            add_packed_forward(model)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        out.log_probs.sum().backward()
        return out.log_probs.detach(), model.get_input_embeddings().weight.grad

    (padded, padded_grad), (packed, packed_grad) = scored(False), scored(True)
    assert packed.shape == padded.shape == (3, 12)
    assert torch.allclose(packed, padded, atol=1e-5) and (packed != 0).sum() == (labels[:, 1:] != -100).sum()
    assert torch.allclose(packed_grad, padded_grad, atol=1e-5)
