"""YAML recipes to typed dataclasses, with errors that name the file, the key and the fix.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Opt:
    ...     lr: float = 1e-3
    ...     steps: int = 10
    >>> data = apply_overrides({"lr": "5e-4"}, ["steps=20"], source="demo.yaml")
    >>> build(Opt, data, source="demo.yaml")
    Opt(lr=0.0005, steps=20)
    >>> build(Opt, {"lrr": 1}, source="demo.yaml")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: demo.yaml: unknown key 'lrr' (did you mean 'lr'?)

Works for third-party dataclasses too (``trl.SFTConfig``, ``transformers.TrainingArguments``):
keys are checked against ``dataclasses.fields`` and the object is built with ``cls(**kwargs)``.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from smolforge.errors import RecipeError
from smolforge.jsonable import to_dict

__all__ = [
    "load_yaml", "apply_overrides", "set_path", "build", "to_dict", "deep_merge",
    "build_stage_recipe", "load_recipe", "FRACTION",
]

# ``field(default=0.2, metadata=FRACTION)``: a share, a probability or a ratio; build() refuses a value
# above 1 (and, like every number not marked ``{"negative": True}``, below 0). ``{"max": x}`` sets another bound.
FRACTION = {"max": 1.0}


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads unknown tags (``!function utils.process``) as plain values."""


def _construct_unknown(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(None, _construct_unknown)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML file whose top level is a mapping; errors name the file (and line).

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "r.yaml")
    >>> _ = open(f, "w").write("stage: eval\\nprocess: !function utils.process\\n")
    >>> load_yaml(f)
    {'stage': 'eval', 'process': 'utils.process'}
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe file not found") from None
    except IsADirectoryError:
        raise RecipeError(f"{path}: is a folder, expected a YAML recipe file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc})") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError(f"{path}{where}: invalid YAML: {problem}") from None
    if data is None:
        raise RecipeError(f"{path}: recipe is empty, expected a mapping of keys to values")
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}: top level must be a mapping of keys to values, got a {_kind(data)}"
        )
    return data


def set_path(data: dict, dotted: str, value: Any, source: str = "--set") -> None:
    """Set ``data[a][b][c] = value`` for ``dotted="a.b.c"``, creating intermediate mappings.

    >>> d = {}
    >>> set_path(d, "trainer.max_steps", 5)
    >>> d
    {'trainer': {'max_steps': 5}}
    """
    parts = str(dotted).split(".")
    if not all(p.strip() for p in parts):
        raise RecipeError(f"{source}: '{dotted}' is not a valid key path (use a.b.c)")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise RecipeError(
                f"{source}: cannot set '{dotted}': '{where}' is a {_kind(child)}, not a mapping"
            )
        node = child
    node[parts[-1]] = value


def apply_overrides(data: dict, sets: Iterable[str], source: str) -> dict:
    """Return a copy of ``data`` with each ``a.b.c=value`` applied; values are parsed as YAML.

    >>> apply_overrides({"trainer": {"lr": 1}}, ["trainer.max_steps=5", "lora.r=8", "tags=[a, b]"], "x.yaml")
    {'trainer': {'lr': 1, 'max_steps': 5}, 'lora': {'r': 8}, 'tags': ['a', 'b']}
    """
    out = copy.deepcopy(data)
    for item in sets:
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise RecipeError(
                f"{source}: override '{item}' must look like key.path=value "
                "(e.g. --set trainer.max_steps=20)"
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw  # not YAML: take the text as written
        set_path(out, key.strip(), value, source)
    return out


# --------------------------------------------------------------------------- build


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _type_hints(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass; per-field best effort when some cannot resolve."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - forward refs we cannot resolve: fall back per field
        pass
    hints: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        ann = f.type
        if isinstance(ann, str):
            namespace = dict(vars(sys.modules.get(cls.__module__, types.ModuleType("_"))))
            try:
                ann = eval(ann, namespace)  # noqa: S307 - annotation text from the class itself
            except Exception:  # noqa: BLE001 - leave it unchecked
                ann = Any
        hints[f.name] = ann
    return hints


def _unwrap_optional(ann: Any) -> tuple[Any, bool]:
    """``X | None`` / ``Optional[X]`` -> (X, True); a lone type -> (type, False); else (None, ...)."""
    origin = typing.get_origin(ann)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        optional = len(args) < len(typing.get_args(ann))
        return (args[0] if len(args) == 1 else None), optional
    return ann, False


def _dataclass_of(ann: Any) -> tuple[type | None, bool]:
    inner, optional = _unwrap_optional(ann)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return inner, optional
    return None, optional


_SCALAR_NAMES = {bool: "a boolean (true/false)", int: "an int", float: "a float", str: "a string"}

# The largest whole number a float holds exactly (2**53): an int field takes a float such as ``3.0``
# only up to there; ``1.0e+30`` for ``max_steps`` is refused, not truncated to 10**30 steps.
_EXACT_FLOAT_INT = 2 ** 53


def _is_float_text(text: str) -> bool:
    try:
        float(text.strip())
    except ValueError:
        return False
    return True


def _check_scalar(value: Any, kind: type, where: str) -> Any:
    """Return ``value`` converted to ``kind`` (int/float/str/bool) or raise ``where`` must be ...

    An int field takes an int, a whole float up to 2**53 (``3.0``) or such a number as text;
    never a boolean, a fraction or a float too large to be a whole number exactly.

    >>> _check_scalar(3.0, int, "r.yaml: 'steps'"), _check_scalar("20", int, "r.yaml: 'steps'")
    (3, 20)
    >>> _check_scalar(1.0e+30, int, "r.yaml: 'trainer.max_steps'")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: r.yaml: 'trainer.max_steps' must be an int, got 1e+30 (a float)
    >>> _check_scalar(True, int, "r.yaml: 'trainer.max_steps'")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: r.yaml: 'trainer.max_steps' must be an int, got true (a boolean)
    """
    def bad() -> RecipeError:
        shown = repr(value)
        if isinstance(value, bool):
            shown = f"{str(value).lower()} (a boolean)"         # as YAML wrote it
        elif kind is int and isinstance(value, float):
            shown = f"{value!r} (a float)"
        elif kind is int and isinstance(value, str) and _is_float_text(value):
            shown = f"{value.strip()} (a float)"                  # YAML 1.1 reads 1e30 as text
        return RecipeError(f"{where} must be {_SCALAR_NAMES[kind]}, got {shown}")

    if kind is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if kind is str:
        if isinstance(value, str):
            return value
        raise bad()
    if isinstance(value, bool):
        raise bad()
    if kind is float:
        if isinstance(value, (int, float)):
            return value  # ints are fine where a float is expected
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise bad() from None
        raise bad()
    # kind is int
    if isinstance(value, int):
        return value
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise bad() from None
    if (isinstance(number, float) and math.isfinite(number) and number.is_integer()
            and abs(number) <= _EXACT_FLOAT_INT):
        return int(number)
    raise bad()


def check_keys(data: Mapping[str, Any], valid: Sequence[str], where: str, otherwise: str | None = None) -> None:
    """RecipeError for the first key of ``data`` that is not in ``valid``, naming the closest valid
    key, else ``otherwise`` (default: the valid keys).

    >>> check_keys({"pipline": []}, ("pipeline", "eval"), "p.yaml")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: p.yaml: unknown key 'pipline' (did you mean 'pipeline'?)
    """
    for key in data:
        if key not in valid:
            raise _unknown_key(where, "", key, list(valid), otherwise)


def _unknown_key(source: str, prefix: str, key: Any, valid: list[str], otherwise: str | None = None) -> RecipeError:
    close = difflib.get_close_matches(str(key), valid, n=1)
    if close:
        hint = f"did you mean '{prefix}{close[0]}'?"
    else:
        hint = otherwise or "valid keys: " + ", ".join(valid[:40]) + (", ..." if len(valid) > 40 else "")
    return RecipeError(f"{source}: unknown key '{prefix}{key}' ({hint})")


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def build(cls: type, data: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, checking keys and scalar types; nested recursively.

    Fields annotated with a dataclass (also ``X | None``) are built from nested mappings with
    ``prefix="name."``; int/float/str/bool fields are type-checked (numeric strings such as
    YAML's ``5e-4`` are converted). Annotations that cannot be resolved (classes defined inside
    a function) are left unchecked.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Recipe:
    ...     name: str
    ...     lr: float = 1e-3
    >>> build(Recipe, {"name": "x", "lr": "5e-4"}, "r.yaml")
    Recipe(name='x', lr=0.0005)
    >>> build(Recipe, {"name": "x", "lr": "fast"}, "r.yaml")
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: r.yaml: 'lr' must be a float, got 'fast'
    """
    where_self = f"'{prefix[:-1]}'" if prefix else "the recipe"
    if not isinstance(data, Mapping):
        raise RecipeError(f"{source}: {where_self} must be a mapping of keys, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    aliases = {f.metadata["key"]: name for name, f in fields.items() if f.metadata.get("key")}
    if aliases:   # a field whose YAML key is a Python keyword (``async`` → ``async_``) names it in its metadata
        data = {aliases.get(key, key): value for key, value in data.items()}
    valid = list(fields)
    for key in data:
        if key not in fields:
            raise _unknown_key(source, prefix, key, valid)
    missing = [n for n, f in fields.items() if n not in data and not _has_default(f)]
    if missing:
        names = ", ".join(f"'{prefix}{n}'" for n in missing)
        raise RecipeError(f"{source}: missing required key{'s' if len(missing) > 1 else ''} {names}")

    hints = _type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        kwargs[key] = _build_value(fields[key], hints.get(key, Any), value, source, prefix,
                                   own=cls.__module__.startswith("smolforge"))
    try:
        return cls(**kwargs)
    except RecipeError:
        raise
    except (TypeError, ValueError) as exc:
        where = f"invalid '{prefix[:-1]}': " if prefix else ""
        raise RecipeError(f"{source}: {where}{exc}") from None


def _negative_allowed(f: dataclasses.Field) -> bool:
    """Counts, sizes, rates, seeds and thresholds are never negative. A field where a negative number
    means something says so: smolforge's with ``field(metadata={"negative": True})``, a library's
    (TrainingArguments' ``max_steps=-1``) with a negative default."""
    default = f.default if f.default is not dataclasses.MISSING else None
    return bool(f.metadata.get("negative")) or (isinstance(default, (int, float)) and not isinstance(default, bool)
                                                 and default < 0)


def _build_value(f: dataclasses.Field, ann: Any, value: Any, source: str, prefix: str, own: bool = True) -> Any:
    where = f"{source}: '{prefix}{f.name}'"
    sub, optional = _dataclass_of(ann)
    if sub is not None:
        if value is None:
            if optional or f.default is None:
                return None
            raise RecipeError(f"{where} must be a mapping of keys, got null")
        if isinstance(value, sub):
            return value
        if not isinstance(value, Mapping):
            raise RecipeError(f"{where} must be a mapping of keys, got {value!r}")
        return build(sub, value, source, prefix=f"{prefix}{f.name}.")
    inner, optional = _unwrap_optional(ann)
    if inner in _SCALAR_NAMES:
        if value is None:
            if optional or f.default is None:
                return None
            raise RecipeError(f"{where} must be {_SCALAR_NAMES[inner]}, got null")
        value = _check_scalar(value, inner, where)
        if inner in (int, float) and value < 0 and not _negative_allowed(f):
            raise RecipeError(f"{source}: {prefix}{f.name} must be >= 0, got {value!r}")
        if inner in (int, float) and "max" in f.metadata and value > f.metadata["max"]:
            raise RecipeError(f"{source}: {prefix}{f.name} must be <= {f.metadata['max']:g}, got {value!r}")
        return value
    if value is None:
        return value
    container = typing.get_origin(inner) or inner
    if container is list and not (isinstance(value, (list, tuple)) or (isinstance(value, str) and not own)):
        raise RecipeError(f"{where} must be a list, got {value!r}")   # a library config may take one name
    if container is dict and not isinstance(value, Mapping):
        raise RecipeError(f"{where} must be a mapping of keys, got {value!r}")
    if inner is None:                                   # a union of several types, e.g. dict | str
        allowed = [typing.get_origin(a) or a for a in typing.get_args(ann) if a is not type(None)]
        names = {dict: "a mapping", str: "a string", list: "a list", int: "an int", float: "a float",
                 bool: "a boolean"}
        if allowed and all(a in names for a in allowed) and not any(
                isinstance(value, Mapping if a is dict else a) and not (a in (int, float) and isinstance(value, bool))
                for a in allowed):
            raise RecipeError(f"{where} must be {' or '.join(names[a] for a in allowed)}, got {value!r}")
    return value


# --------------------------------------------------------------------------- stage recipes


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict:
    """``over`` on top of ``base``: nested mappings merge key by key, anything else replaces.

    >>> deep_merge({"trainer": {"use_cpu": True, "max_steps": 10}}, {"trainer": {"max_steps": 5}})
    {'trainer': {'use_cpu': True, 'max_steps': 5}}
    """
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def build_stage_recipe(module: Any, data: Mapping[str, Any], source: str) -> Any:
    """Build ``module.Recipe`` from ``data``, laid over ``module.defaults()`` when it has one.

    A stage whose recipe holds a library config (``trainer: SFTConfig``) defines
    ``defaults() -> {"trainer": {...}}`` so that a YAML ``trainer:`` mapping with a few keys
    keeps the stage's defaults for the others instead of the library's.

    >>> import types
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Recipe:
    ...     name: str = "x"
    ...     steps: int = 1
    >>> stage = types.SimpleNamespace(Recipe=Recipe, defaults=lambda: {"steps": 7})
    >>> build_stage_recipe(stage, {"name": "y"}, "r.yaml")
    Recipe(name='y', steps=7)
    """
    defaults = getattr(module, "defaults", None)
    if callable(defaults):
        data = deep_merge(defaults() or {}, data)
    return build(module.Recipe, data, source)


def load_recipe(path: str | Path, sets: Iterable[str] = ()) -> tuple[str, dict]:
    """Load a stage recipe, apply ``--set`` overrides; return (stage name, the other keys).

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "sft.yaml")
    >>> _ = open(f, "w").write("stage: sft\\nname: sft-demo\\n")
    >>> load_recipe(f, ["trainer.max_steps=20"])
    ('sft', {'name': 'sft-demo', 'trainer': {'max_steps': 20}})
    """
    from smolforge.registry import stages  # registry is spine-only and cheap

    data = load_yaml(path)
    data = apply_overrides(data, sets, source=str(path))
    known = ", ".join(sorted(stages()))
    if "stage" not in data:
        if "pipeline" in data:
            raise RecipeError(
                f"{path}: this is a pipeline recipe; run it with: smolforge pipeline {path}"
            )
        raise RecipeError(f"{path}: missing top-level key 'stage' (one of: {known})")
    stage = data.pop("stage")
    if not isinstance(stage, str) or stage not in stages():
        from smolforge.registry import unknown_stage_message

        raise RecipeError(f"{path}: {unknown_stage_message(stage)}")
    return stage, data
