"""A GGUF file (llama.cpp's format: a released model, often quantized) as a Hugging Face model folder.

    smolforge import SmolLM2-135M-Instruct.Q4_1.gguf --name smollm2
    smolforge import ./models/smollm2/ --name smollm2      # a folder holding one .gguf and no config.json

:func:`inspect_gguf` reads the file's header only (magic, version, metadata: architecture, name,
quantization, chat template) and checks that transformers can load the architecture, before any
run exists. :func:`dequantize_to_folder` then loads it with transformers' GGUF loader (the ``gguf``
package dequantizes every tensor, to fp32 by default), drops the quantization marker the loader
leaves on the config (which would make ``save_pretrained`` refuse), and writes a plain safetensors
folder with the tokenizer and its chat template. The run records the file's sha256 and its
quantization (the file type and a count of tensor types), so the lineage says the weights were
dequantized from Q4_1, not trained in fp32.

Reading a GGUF header means parsing its whole metadata, the tokenizer's vocabulary included (SmolLM2's
49,152 tokens: about 6 s on 2 cores). transformers' loader reads it anew for the config, the tokenizer
and the weights, so one reader per file (:func:`reader`) is shared by the check and all three.

    >>> import tempfile, pathlib
    >>> bad = pathlib.Path(tempfile.mkdtemp()) / "model.gguf"
    >>> _ = bad.write_bytes(b"PK\\x03\\x04 not a gguf file")
    >>> inspect_gguf(bad)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: .../model.gguf: not a GGUF file (it starts with b'PK\\x03\\x04', GGUF files with b'GGUF')
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from smolforge.errors import RecipeError, RunError

__all__ = ["GGUFFile", "inspect_gguf", "find_gguf", "dequantize_to_folder", "reader", "shared_readers", "MAGIC"]

MAGIC = b"GGUF"


@dataclasses.dataclass
class GGUFFile:
    """What :func:`inspect_gguf` read from a GGUF header."""

    path: Path                 # the .gguf file
    architecture: str          # general.architecture (llama, qwen2, gemma3, ...)
    name: str | None           # general.name
    quantization: str          # the file type, e.g. MOSTLY_Q4_1
    tensor_types: dict         # tensor type -> count, e.g. {"Q4_1": 210, "F32": 61}
    tensors: int               # tensors in the file
    chat_template: bool        # tokenizer.chat_template is present
    size: int                  # bytes


def find_gguf(folder: Path) -> Path | None:
    """The one ``.gguf`` file of a folder without ``config.json`` (None when it has none); RunError for several."""
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() == ".gguf")
    if len(found) > 1:
        raise RunError(f"'{folder}' holds {len(found)} GGUF files ({', '.join(p.name for p in found[:4])}); "
                       "import one by its path")
    return found[0] if found else None


def _gguf_module():
    try:
        import gguf
    except ImportError:
        raise RecipeError("importing a .gguf file needs the `gguf` package (pip install gguf; make setup installs "
                          "it)") from None
    return gguf


def _text(field) -> str | None:
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def reader(path: Path):
    """The ``gguf.GGUFReader`` of ``path``, parsed once per version of the file (size and mtime) in this process."""
    stat = path.stat()
    return _cached_reader(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, size: int, mtime_ns: int):
    return _gguf_module().GGUFReader(path)


@contextlib.contextmanager
def shared_readers() -> Iterator[None]:
    """While open, ``gguf.GGUFReader(path)`` (read-only) is :func:`reader`'s one parse of the file, for the
    loaders that construct their own (transformers' config, tokenizer and weights loaders each do), and
    ``gguf.get_tensor_name_map(arch, blocks)`` is built once per pair: transformers' weights loader asks
    for it again for every submodule it walks (397 times for SmolLM2-135M, ≈ 4 s of building the same
    read-only table)."""
    gguf = _gguf_module()
    original, original_names = gguf.GGUFReader, gguf.get_tensor_name_map

    def shared(path, mode="r"):
        return reader(Path(path)) if mode == "r" else original(path, mode)

    gguf.GGUFReader = shared
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(original_names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = original, original_names


def inspect_gguf(path: str | Path) -> GGUFFile:
    """Read and check a GGUF file's header; RunError (damaged, unsupported) or RecipeError (no ``gguf``)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RunError(f"GGUF file '{path}' not found")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != MAGIC:
        raise RunError(f"{path}: not a GGUF file (it starts with {head!r}, GGUF files with {MAGIC!r})")
    gguf = _gguf_module()
    try:
        parsed = reader(path)
    except Exception as exc:  # noqa: BLE001 - a truncated or damaged file: numpy/struct errors, one line
        raise RunError(f"{path}: cannot read the GGUF file ({type(exc).__name__}: {exc}); is it truncated? "
                       "download or copy it again") from None
    architecture = _text(parsed.fields.get("general.architecture"))
    if not architecture:
        raise RunError(f"{path}: the GGUF metadata has no general.architecture")
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        GGUF_SUPPORTED_ARCHITECTURES = None
    if GGUF_SUPPORTED_ARCHITECTURES is not None and architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise RunError(f"{path}: transformers cannot load GGUF architecture '{architecture}' (it loads "
                       f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:12])}, ...): convert it to a safetensors "
                       "folder elsewhere and import that")
    file_type = parsed.fields.get("general.file_type")
    quantization = "unknown"
    if file_type is not None:
        code = int(file_type.parts[file_type.data[0]][0])
        try:
            quantization = gguf.LlamaFileType(code).name
        except ValueError:
            quantization = f"file type {code}"
    types = Counter(gguf.GGMLQuantizationType(int(t.tensor_type)).name for t in parsed.tensors)
    return GGUFFile(path=path, architecture=architecture, name=_text(parsed.fields.get("general.name")),
                    quantization=quantization, tensor_types=dict(sorted(types.items())), tensors=len(parsed.tensors),
                    chat_template="tokenizer.chat_template" in parsed.fields, size=path.stat().st_size)


def dequantize_to_folder(found: GGUFFile, target: Path, dtype: str = "float32") -> None:
    """Write ``found`` to ``target`` as a plain model folder (safetensors, config, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(found.path.parent), found.path.name
    try:
        with shared_readers():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    except Exception as exc:  # noqa: BLE001 - transformers' GGUF loader: one line; --debug shows the cause
        raise RunError(f"{found.path}: transformers could not load it ({type(exc).__name__}: "
                       f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config   # the GGUF marker: the weights in memory are plain tensors now
    config.dtype = dtype
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    del loaded
    shutil.rmtree(target, ignore_errors=True)
    plain.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
