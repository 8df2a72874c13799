"""The points of a run that the eval audit scores: its checkpoints and its final model.

A run's points are its ``checkpoints/step-N/`` (pretraining: DeepSpeed engine state, turned into
a temporary HF model folder by :func:`export_checkpoint` with the architecture and tokenizer of
the run's ``model/``; ZeRO-0/1/2 states hold the full weights, ZeRO-3 shards are consolidated
with DeepSpeed's ``zero_to_fp32``), its ``checkpoints/checkpoint-N/`` (HF Trainer folders,
loadable as they are) and its final ``model/`` at step ``train/steps`` of run.json (it replaces
a checkpoint of the same step).

    >>> Checkpoint(step=8, path=Path("runs/x/checkpoints/checkpoint-8"), kind="hf").label
    'checkpoints/checkpoint-8'
"""
from __future__ import annotations

import contextlib
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

from smolforge.errors import RunError
from smolforge.runs import Run

__all__ = ["WEIGHT_FILES", "Checkpoint", "find_checkpoints", "export_checkpoint"]

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")


@dataclass
class Checkpoint:
    """One scorable point of a run: its training step, where it is, and its format.

    ``kind``: ``model`` (the run's final ``model/``), ``hf`` (a folder ``from_pretrained`` loads)
    or ``deepspeed`` (engine state that :func:`export_checkpoint` turns into an HF folder).

    >>> Checkpoint(step=100, path=Path("runs/x/checkpoints/step-100"), kind="deepspeed").label
    'checkpoints/step-100'
    """
    step: int
    path: Path
    kind: str

    @property
    def label(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}" if self.kind != "model" else "model"


def _step_in_name(name: str) -> int | None:
    for prefix in ("step-", "checkpoint-"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return int(name[len(prefix):])
    return None


def _is_deepspeed(folder: Path) -> bool:
    return any(folder.glob("*/*model_states.pt"))


def find_checkpoints(run: Run) -> list[Checkpoint]:
    """The run's checkpoints (HF and DeepSpeed) and its final ``model/``, by step.

    The final model's step is ``train/steps`` from run.json; it replaces a checkpoint of the
    same step (the same weights). Folders that are neither format are left out.

    >>> import tempfile
    >>> from smolforge.runs import Runs
    >>> with Runs(tempfile.mkdtemp()).start("sft", "sft-x", recipe={}) as run:
    ...     for name in ("checkpoint-5", "checkpoint-10"):
    ...         (run.checkpoints_dir / name).mkdir(parents=True)
    ...         _ = (run.checkpoints_dir / name / "config.json").write_text("{}")
    ...     run.model_dir.mkdir(); _ = (run.model_dir / "config.json").write_text("{}")
    ...     run.finish(metrics={"train/steps": 10})
    >>> [(c.step, c.kind, c.label) for c in find_checkpoints(run)]
    [(5, 'hf', 'checkpoints/checkpoint-5'), (10, 'model', 'model')]
    """
    found: dict[int, Checkpoint] = {}
    if run.checkpoints_dir.is_dir():
        for folder in run.checkpoints_dir.iterdir():
            step = _step_in_name(folder.name)
            if step is None or not folder.is_dir():
                continue
            if (folder / "config.json").is_file():
                found[step] = Checkpoint(step, folder, "hf")
            elif _is_deepspeed(folder):
                found[step] = Checkpoint(step, folder, "deepspeed")
    final_step = run.metrics.get("train/steps")
    if (run.model_dir / "config.json").is_file() and isinstance(final_step, (int, float)):
        found[int(final_step)] = Checkpoint(int(final_step), run.model_dir, "model")
    return [found[s] for s in sorted(found)]


def _deepspeed_state_dict(folder: Path) -> dict:
    import torch

    latest = folder / "latest"
    tag = latest.read_text().strip() if latest.is_file() else "state"
    flat = folder / tag / "mp_rank_00_model_states.pt"
    if flat.is_file():
        try:
            states = torch.load(flat, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - older DeepSpeed pickles objects; this run wrote the file itself
            states = torch.load(flat, map_location="cpu", weights_only=False)
        stage = ((states.get("ds_config") or {}).get("zero_optimization") or {}).get("stage", 0)
        if stage < 3 and states.get("module"):
            return states["module"]  # ZeRO 0-2: every rank holds the full weights (training dtype)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()):  # it prints its progress
        return get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=tag)


def export_checkpoint(checkpoint: Path, model_dir: Path, out_dir: Path) -> Path:
    """Write DeepSpeed checkpoint ``checkpoint`` as an HF model folder ``out_dir``.

    The architecture, tokenizer and chat template come from ``model_dir`` (the run's final
    ``model/``, same shape); the weights from the checkpoint (ZeRO-3 consolidated to fp32).

    >>> import contextlib, io, tempfile, torch
    >>> from smolforge.pretrain.model import ModelShape, build_model
    >>> root = Path(tempfile.mkdtemp())
    >>> model = build_model(ModelShape(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
    ...                                num_kv_heads=1, max_position_embeddings=64), vocab_size=50)
    >>> with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed's import-time notice
    ...     model.save_pretrained(root / "model")
    >>> (root / "step-3" / "state").mkdir(parents=True)
    >>> trained = {k: v + 1 for k, v in model.state_dict().items()}
    >>> torch.save({"module": trained, "ds_config": {}}, root / "step-3" / "state" / "mp_rank_00_model_states.pt")
    >>> out = export_checkpoint(root / "step-3", root / "model", root / "hf-3")
    >>> from transformers import AutoModelForCausalLM
    >>> loaded = AutoModelForCausalLM.from_pretrained(out)
    >>> torch.equal(loaded.lm_head.weight, trained["lm_head.weight"])
    True
    """
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    architecture = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    cls = getattr(transformers, architecture, transformers.AutoModelForCausalLM)
    model = cls.from_config(config) if cls is transformers.AutoModelForCausalLM else cls(config)
    state = _deepspeed_state_dict(Path(checkpoint))
    with torch.no_grad():
        outcome = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = set(state)
    untied = [k for k in outcome.missing_keys
              if not any(params.get(k) is params.get(j) for j in loaded if j in params)]
    if untied or outcome.unexpected_keys:
        raise RunError(f"{checkpoint}: its weights do not fit the architecture of {model_dir} "
                       f"(missing {untied[:5]}, unexpected {outcome.unexpected_keys[:5]})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {p.name for pattern in WEIGHT_FILES for p in Path(model_dir).glob(pattern)}
    for item in Path(model_dir).iterdir():
        if item.is_file() and item.name not in weights:
            shutil.copy2(item, out_dir / item.name)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
