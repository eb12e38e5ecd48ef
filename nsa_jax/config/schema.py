"""The config's schema: one frozen dataclass per section (model, nsa, data, train, run, mesh,
exec) with its own ``validate``, the whole :class:`Config`, and :func:`config_warnings` (settings
that are valid but probably not meant). Reading YAML and overrides into it: :mod:`.loading`."""
from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from nsa_jax.nsa.config import NSAConfig
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
        if self.max_docs < 0:
            raise ConfigError(f"data.max_docs: must be >= 0 (0 = all documents), got "
                              f"{self.max_docs}")
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
    # training and prefill (auto: pallas on GPU, else reference); "pallas" also runs a chunked
    # prefill's continuation chunks on the Pallas kernels, for NSA and dense models (pallas.chunk)
    nsa_impl: Literal["auto", "reference", "pallas"] = "auto"
    # auto: cudnn on GPU, else xla; packed documents: the Pallas document-local kernel on GPU
    # unless "xla" (masked, O(T^2) memory)
    dense_impl: Literal["auto", "xla", "cudnn"] = "auto"
    remat: Literal["none", "block"] = "none"     # block: recompute each block's activations
    # the decode step's attention (NSA, and dense: its flash-decoding kernel) and cache writes
    decode_impl: Literal["auto", "reference", "pallas"] = "auto"
    kernel: KernelChoices = dataclasses.field(default_factory=KernelChoices)
    # a directory for JAX's persistent compilation cache (nsa_jax.compile_cache): a later run
    # of the same program on the same kind of machine reads its compiled steps from there
    compile_cache: Optional[str] = None

    def validate(self) -> None:
        if self.compile_cache is not None and not str(self.compile_cache).strip():
            raise ConfigError("exec.compile_cache: empty; give a directory or leave it unset")


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
# The keys that fix the token stream a run trains on: its saved data position means something only
# under equal ones (a resume refuses others; fine-tuning on other data is train.init_from).
# Not here: how the stream is read (data.prefetch, data.retries, data.retry_backoff_s) and what
# only data preparation uses (data.out_dir, data.shard_tokens).
DATA_STREAM_KEYS = tuple(f"data.{k}" for k in (
    "source", "path", "text_field", "tokenizer", "seq_len", "hf_name", "hf_config", "hf_split",
    "eval_fraction", "synthetic_vocab", "max_docs", "shuffle", "packing", "retrieval")) + (
    "train.seed",)


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
