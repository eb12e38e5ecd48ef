"""One typed configuration: YAML -> dataclasses (sections model, nsa, data, train, run, mesh, exec).

``model`` and ``nsa`` say what the model is (they fix the parameter shapes); ``exec`` says how to
run it (implementations, rematerialisation, kernel algorithm choices), which may change between
a run and its resume. A section may nest another (``exec.kernel``, ``data.retrieval``): overrides
take dotted paths of any depth (``train.steps=100``, ``exec.kernel.sel_impl=tiled``,
``data.retrieval.pairs=48``) and YAML nested mappings.

``load_config(path, overrides)`` reads a YAML file (a key given twice in one mapping is an
error), applies the overrides, rejects unknown keys (naming the full dotted key) and wrong types,
and validates every section before any compute. Every problem raises :class:`ConfigError` with
one line naming the key. Keys that moved (:data:`MOVED`) still load, with one note naming the
new key; :func:`config_warnings` lists settings that are valid but probably not meant.
"""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from nsa_jax.nsa.config import NSAConfig, NSAConfigError
from nsa_jax.nsa.options import KernelChoices


class ConfigError(ValueError):
    """Invalid configuration; the message names the offending key or file."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 50304
    dim: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_groups: int = 2
    head_dim: int = 64
    mlp_hidden: int = 2048          # SwiGLU hidden width
    attention: Literal["nsa", "dense"] = "nsa"
    phi_hidden: int = 0             # φ MLP hidden width; 0 means 4 * head_dim
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    param_dtype: Literal["float32"] = "float32"
    loss_chunk: int = 2048          # tokens per cross-entropy chunk (logits never materialised whole)
    init_std: float = 0.02
    # initial bias of the NSA gate logits, per branch (cmp, slc, win): gate = sigmoid(W x + b),
    # W ~ N(0, init_std); 0 gives every gate ~0.5 at the start (the paper does not say)
    gate_bias: tuple[float, ...] = (0.0, 0.0, 0.0)

    def validate(self) -> None:
        for f in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_groups", "head_dim",
                  "mlp_hidden"):
            if getattr(self, f) < 1:
                raise ConfigError(f"model.{f}: must be >= 1, got {getattr(self, f)}")
        if self.n_heads % self.n_kv_groups:
            raise ConfigError(f"model.n_kv_groups: n_heads={self.n_heads} must be a multiple of "
                              f"n_kv_groups={self.n_kv_groups}")
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim: must be even for RoPE, got {self.head_dim}")
        if self.loss_chunk < 1:
            raise ConfigError(f"model.loss_chunk: must be >= 1, got {self.loss_chunk}")
        if self.phi_hidden < 0:
            raise ConfigError(f"model.phi_hidden: must be >= 0, got {self.phi_hidden}")
        if self.rope_theta <= 0:
            raise ConfigError(f"model.rope_theta: must be > 0, got {self.rope_theta}")
        if len(self.gate_bias) != 3:
            raise ConfigError(f"model.gate_bias: must be 3 numbers (cmp, slc, win), got "
                              f"{list(self.gate_bias)}")


@dataclasses.dataclass(frozen=True)
class RetrievalConfig:
    """``data.retrieval``: key-value pairs in filler, queries at the end (layout and meaning of
    every key: :mod:`nsa_jax.data.retrieval`)."""
    pairs: int = 64                 # (PAIR, key, value) triples per row
    queries: int = 16               # (QUERY, key, value) triples ending each row
    keys: int = 256                 # distinct key ids
    values: int = 256               # distinct value ids (chance = 1/this)
    values_per_key: int = 0         # 0 = a pair's value is any of the values; n = key i's
    #   values are value ids [i*n, (i+1)*n) (chance 1/n): one-hop retrieval
    filler: int = 0                 # filler ids; 0 = all ids left below vocab
    filler_mode: Literal["random", "cycle", "repeat", "copy"] = "random"  # filler kind
    filler_period_min: int = 0      # repeat/copy filler: segment length range
    filler_period_max: int = 0      # (repeat: the period; copy: the copied segments)
    copy_fraction: float = 0.5      # copy filler: share of segments copied
    value_repeat: int = 1           # a stored pair is PAIR, key, then its value r times (a
    #   longer needle, filling a compressed block); queries stay (marker, key, value)
    filler_groups: int = 0          # copy filler: 0 = iid ids; G = each fresh filler id drawn
    #   from the group (id mod G) of the id two places back (skip-bigram)
    min_distance: int = 1           # query-to-key distance range (tokens)
    max_distance: int = 0           # 0 = as far as the row allows
    distance: Literal["uniform", "log"] = "uniform"  # distance distribution
    query_marker: Literal["query", "pair"] = "query"  # first token of a query
    loss: Literal["all", "answers"] = "all"  # train on every target or on the answers only


# data.packing=documents needs document boundaries: the sources that have them
PACKED_SOURCES = ("text", "hf", "tokens")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: Literal["synthetic", "text", "hf", "tokens", "retrieval"] = "synthetic"
    path: Optional[str] = None          # file, directory or glob (text, tokens)
    text_field: str = "text"            # column for jsonl / parquet / hf
    tokenizer: str = "gpt2"             # gpt2 | byte | path/to/tokenizer.json
    seq_len: int = 128
    hf_name: str = "HuggingFaceFW/fineweb-edu"
    hf_config: Optional[str] = "sample-10BT"
    hf_split: str = "train"
    eval_fraction: float = 0.05         # held-out share of documents (text/hf) or tokens (tokens)
    prefetch: int = 2                   # batches prepared ahead by a background thread
    synthetic_vocab: int = 0            # synthetic: token ids drawn below this; 0 = model vocab
    out_dir: Optional[str] = None       # prepare: where shards are written
    shard_tokens: int = 50_000_000      # prepare: tokens per shard
    max_docs: int = 0                   # 0 = all documents
    shuffle: bool = True                # tokens: visit train windows in a seeded order per epoch
    retries: int = 5                    # hf: attempts for a failing read before giving up
    retry_backoff_s: float = 1.0        # hf: first wait between retries (doubles each time)
    packing: Literal["concat", "documents"] = "concat"  # text, hf, tokens: concat = documents
    #   joined by EOS, attention across them; documents = the same windows plus segment ids, each
    #   document its own sequence (positions restart, no attention or target across a boundary)
    retrieval: RetrievalConfig = dataclasses.field(default_factory=RetrievalConfig)

    def validate(self) -> None:
        if self.seq_len < 1:
            raise ConfigError(f"data.seq_len: must be >= 1, got {self.seq_len}")
        if self.source in ("text", "tokens") and not self.path:
            raise ConfigError(f"data.path: required when data.source={self.source}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"data.eval_fraction: must be in [0, 1), got {self.eval_fraction}")
        if self.retries < 0:
            raise ConfigError(f"data.retries: must be >= 0, got {self.retries}")
        if self.retry_backoff_s < 0:
            raise ConfigError(f"data.retry_backoff_s: must be >= 0, got {self.retry_backoff_s}")
        if self.prefetch < 0:
            raise ConfigError(f"data.prefetch: must be >= 0, got {self.prefetch}")
        if self.retrieval.loss == "answers" and self.source != "retrieval":
            raise ConfigError(f"data.retrieval.loss: answers needs data.source=retrieval (answer "
                              f"targets exist only there), got data.source={self.source}")
        if self.packing == "documents" and self.source not in PACKED_SOURCES:
            raise ConfigError(f"data.packing: documents needs document boundaries, but "
                              f"data.source={self.source} has none (each row is one generated "
                              f"sequence); use data.packing=concat")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 8                 # global batch, in sequences, per optimizer step
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    decay_norms_biases_embeddings: bool = False
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0                 # 0 = never
    eval_batches: int = 4
    ckpt_every: int = 0                 # 0 = only at the end
    ckpt_keep: int = 3
    profile_steps: Optional[list[int]] = None   # [first, last] steps to trace
    max_bad_steps: int = 5              # stop after this many non-finite steps in a row
    data_timeout_s: float = 0.0         # a batch that takes longer is a stalled read; 0 = wait
    init_from: Optional[str] = None     # run dir whose newest checkpoint's weights start a fresh
    #   run (fresh optimizer, step 0; e.g. continue a short-context run at a longer seq_len)

    def validate(self) -> None:
        for f in ("steps", "batch_size", "grad_accum", "log_every", "ckpt_keep", "eval_batches",
                  "max_bad_steps"):
            if getattr(self, f) < 1:
                raise ConfigError(f"train.{f}: must be >= 1, got {getattr(self, f)}")
        for f in ("warmup_steps", "eval_every", "ckpt_every"):
            if getattr(self, f) < 0:
                raise ConfigError(f"train.{f}: must be >= 0, got {getattr(self, f)}")
        if self.lr <= 0:
            raise ConfigError(f"train.lr: must be > 0, got {self.lr}")
        if self.init_from is not None and not str(self.init_from).strip():
            raise ConfigError("train.init_from: empty; give a run directory or leave it unset")
        if self.data_timeout_s < 0:
            raise ConfigError(f"train.data_timeout_s: must be >= 0, got {self.data_timeout_s}")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"train.grad_accum: batch_size={self.batch_size} must be a multiple "
                              f"of grad_accum={self.grad_accum}")
        if self.profile_steps is not None and (len(self.profile_steps) != 2
                                               or self.profile_steps[0] > self.profile_steps[1]):
            raise ConfigError(f"train.profile_steps: must be [first, last], got {self.profile_steps}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    dir: Optional[str] = None           # default runs/<config-name>-<timestamp>
    resume: bool = False
    watchdog_s: float = 0.0             # no step for this long: dump stacks, exit 3; 0 = off

    def validate(self) -> None:
        if self.watchdog_s < 0:
            raise ConfigError(f"run.watchdog_s: must be >= 0, got {self.watchdog_s}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1                      # -1: all devices not used by fsdp
    fsdp: int = 1

    def validate(self) -> None:
        if self.fsdp < 1:
            raise ConfigError(f"mesh.fsdp: must be >= 1, got {self.fsdp}")
        if self.data == 0 or self.data < -1:
            raise ConfigError(f"mesh.data: must be >= 1 or -1 (all), got {self.data}")


@dataclasses.dataclass(frozen=True)
class ExecConfig:
    """How to run the model: never changes what it computes (beyond float rounding), so a run
    may resume under other choices."""
    nsa_impl: Literal["auto", "reference", "pallas"] = "auto"  # auto: pallas on GPU, else reference
    # auto: cudnn on GPU, else xla; packed documents: the Pallas document-local kernel on GPU
    # unless "xla" (masked, O(T^2) memory)
    dense_impl: Literal["auto", "xla", "cudnn"] = "auto"
    remat: Literal["none", "block"] = "none"     # block: recompute each block's activations
    decode_impl: Literal["auto", "reference", "pallas"] = "auto"  # the decoder's NSA step
    kernel: KernelChoices = dataclasses.field(default_factory=KernelChoices)

    def validate(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    nsa: NSAConfig = dataclasses.field(default_factory=NSAConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    exec: ExecConfig = dataclasses.field(default_factory=ExecConfig)
    name: str = "run"

    def validate(self) -> None:
        for sec in ("model", "data", "train", "run", "mesh", "exec"):
            getattr(self, sec).validate()
        if self.model.attention == "nsa":
            if self.model.head_dim < 1:
                raise ConfigError("model.head_dim: must be >= 1")
        if self.data.seq_len < 1:
            raise ConfigError("data.seq_len: must be >= 1")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["nsa"]["branches"] = list(self.nsa.branches)
        return d


SECTIONS = {"model": ModelConfig, "nsa": NSAConfig, "data": DataConfig, "train": TrainConfig,
            "run": RunConfig, "mesh": MeshConfig, "exec": ExecConfig}
# The sections that fix the parameter shapes: a checkpoint resumes only under equal ones.
SHAPE_SECTIONS = ("model", "nsa")
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


def config_warnings(cfg: Config) -> list[str]:
    """Settings that are valid but probably not meant, one line each (naming the keys)."""
    out, n, seq = [], cfg.nsa, cfg.data.seq_len
    if cfg.model.attention == "nsa":
        blocks = -(-seq // n.sel_block)
        if n.n_sel > blocks:
            out.append(f"nsa.n_sel={n.n_sel} is more than the {blocks} selection block(s) of "
                       f"nsa.sel_block={n.sel_block} tokens a row of data.seq_len={seq} has; "
                       f"every block is always selected")
        if seq < n.block_l:
            out.append(f"data.seq_len={seq} is shorter than nsa.block_l={n.block_l}: the "
                       f"compressed branch never sees a complete block")
    t = cfg.train
    if t.warmup_steps > t.steps:
        out.append(f"train.warmup_steps={t.warmup_steps} is longer than train.steps={t.steps}: "
                   f"the learning rate never reaches train.lr")
    return out


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
