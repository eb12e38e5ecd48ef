"""YAML and ``section.key=value`` overrides -> a validated :class:`~.schema.Config`.

``load_config(path, overrides)`` reads a YAML file (a key given twice in one mapping is an
error), applies the overrides, rejects unknown keys (naming the full dotted key) and wrong types,
and validates every section before any compute. Keys that moved (:data:`MOVED`) still load, with
one note naming the new key. Also the config's way back out: :func:`save_config`,
:func:`describe_keys` (every key with its default) and :func:`yaml_value`."""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from nsa_jax.config.schema import SECTIONS, Config, ConfigError, RetrievalConfig
from nsa_jax.nsa.config import NSAConfigError

# Keys that moved to another section: old configs still load (one note each).
MOVED = {"model.nsa_impl": "exec.nsa_impl", "model.dense_impl": "exec.dense_impl",
         "model.remat": "exec.remat",
         **{f"data.retrieval_{f.name}": f"data.retrieval.{f.name}"
            for f in dataclasses.fields(RetrievalConfig)}}


def _why_moved(new: str) -> str:
    return ("how to run, not what the model is" if new.startswith("exec.") else
            "one section for the retrieval source")


# ---- type coercion -------------------------------------------------------------------------
def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        return _coerce(value, rest[0], key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: must be a list, got {value!r}")
        return origin(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")


def _build(cls, raw: Any, prefix: str):
    """``cls`` (a dataclass) from the mapping ``raw``; a field whose type is a dataclass is a
    nested section, built the same way under ``prefix.field``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix}: must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names, key=str)
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}: unknown key (valid keys: {', '.join(sorted(names))})")
    kwargs = {k: (_build(hints[k], v, f"{prefix}.{k}") if dataclasses.is_dataclass(hints[k])
                  else _coerce(v, hints[k], f"{prefix}.{k}")) for k, v in raw.items()}
    try:
        return cls(**kwargs)
    except NSAConfigError as e:
        raise ConfigError(str(e)) from None
    except (ValueError, TypeError) as e:   # a nested section's own check, e.g. "kernel.x: ..."
        msg, parent = str(e), prefix.rpartition(".")[0]
        leaf = prefix.rpartition(".")[2]
        if msg.startswith(leaf + ".") and parent:
            raise ConfigError(f"{parent}.{msg}") from None
        raise ConfigError(f"{prefix}: {msg}") from None


def migrate(raw: dict, notes: list[str] | None = None) -> dict:
    """``raw`` with the keys of :data:`MOVED` at their new place (dotted paths of any depth);
    a note for each one moved."""
    raw = copy.deepcopy(raw)
    for old, new in MOVED.items():
        opath, npath = old.split("."), new.split(".")
        node = raw
        for part in opath[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or opath[-1] not in node:
            continue
        value = node.pop(opath[-1])
        target = raw
        for part in npath[:-1]:
            if target.get(part) is None:
                target[part] = {}
            target = target[part]
            if not isinstance(target, dict):
                break                    # _build names the bad section
        if not isinstance(target, dict):
            continue
        if npath[-1] in target and target[npath[-1]] != value:
            raise ConfigError(f"{old}: moved to {new}, and both are given ({old}={value!r}, "
                              f"{new}={target[npath[-1]]!r}); keep only {new}")
        target[npath[-1]] = value
        if notes is not None:
            notes.append(f"{old}: moved to {new} ({_why_moved(new)}); read as {new}={value}")
    return raw


def config_from_dict(raw: dict, name: str = "run", notes: list[str] | None = None) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"config: top level must be a mapping, got {type(raw).__name__}")
    raw = migrate(raw, notes)
    name = raw.pop("name", name)
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (valid: {', '.join(SECTIONS)}, name)")
    sections = {s: _build(cls, raw.get(s), s) for s, cls in SECTIONS.items()}
    cfg = Config(name=str(name), **sections)
    cfg.validate()
    return cfg


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. train.steps=100")
    key, _, val = item.partition("=")
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {item!r}: bad key {key!r}")
    try:
        value = yaml.safe_load(val) if val.strip() else None
    except yaml.YAMLError:
        value = val
    return key.split("."), value


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        path, value = parse_override(item)
        if len(path) == 1:
            if path[0] != "name":
                raise ConfigError(f"{path[0]}: overrides need section.key, e.g. train.steps=100")
            raw["name"] = value
            continue
        if path[0] not in SECTIONS:
            raise ConfigError(f"{path[0]}: unknown section (valid: {', '.join(SECTIONS)})")
        node = raw
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                where = ".".join(path[:depth + 1])
                raise ConfigError(f"{'.'.join(path)}: {where} is a value, not a section")
            else:
                child = dict(child)
            node[part] = child
            node = child
        node[path[-1]] = value
    return raw


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (the last would win)."""


def _unique_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"{loader.name}: line {key_node.start_mark.line + 1}: key {key!r} "
                              f"given twice in one mapping (the first would be ignored)")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_config(path: str | Path, overrides: list[str] | None = None,
                notes: list[str] | None = None) -> Config:
    """Load, override and validate a config. Raises ConfigError naming the key or file.
    Notes on keys that moved are appended to ``notes`` (if given)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory; --config takes a YAML file, e.g. "
                          f"configs/tiny.yaml")
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        loader = _UniqueKeyLoader(p.read_text())
        loader.name = str(p)
        try:
            raw = loader.get_single_data() or {}
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML ({str(e).splitlines()[0]})") from None
    except ConfigError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    raw = apply_overrides(raw, list(overrides or []))
    return config_from_dict(raw, name=raw.get("name", p.stem), notes=notes)


def yaml_value(v: Any) -> str:
    """``v`` spelled as in a YAML file or an override: ``true``, ``null``, ``nsa``, ``[3, 5]``."""
    v = list(v) if isinstance(v, tuple) else v
    return yaml.safe_dump(v, default_flow_style=True, width=1 << 30).removesuffix("\n...\n").strip()


def describe_keys() -> str:
    """Every config key with its default, one section per line group (for ``--help``)."""
    lines = []

    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if dataclasses.is_dataclass(v):
                walk(v, f"{prefix}.{f.name}")
            else:
                lines.append(f"  {prefix}.{f.name}={yaml_value(v)}")

    for sec, cls in SECTIONS.items():
        walk(cls(), sec)
    return "\n".join(lines)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
