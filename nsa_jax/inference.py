"""A trained run, from Python: load its newest (or a given) checkpoint and generate text.

    >>> import nsa_jax
    >>> run = nsa_jax.load_run("runs/tiny-20250101-120000")
    >>> run.step                     # the checkpoint step actually loaded
    >>> run.generate(["The history of", "Water is"], max_new_tokens=50, temperature=0)

Built on :func:`nsa_jax.train.inference.restore_for_inference` (config, parameters and the
step loaded) and :func:`nsa_jax.generate.generate_batch` (batched prefill + KV-cache decoding);
the CLI ``python -m nsa_jax.generate`` is a thin layer over the same calls.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Run:
    """A loaded run: ``cfg`` (its resolved :class:`nsa_jax.config.Config`), ``model`` (an
    ``NSALM`` with the checkpoint's float32 parameters), ``tokenizer`` (``data.tokenizer``),
    ``step`` (the checkpoint step loaded) and ``run_dir``."""
    run_dir: Path
    cfg: Any
    model: Any
    tokenizer: Any
    step: int

    @property
    def context(self) -> int:
        """Default context (prompt + new tokens per row): the run's ``data.seq_len``, the length
        it was trained at. Longer contexts may be asked for (``max_len``); RoPE has no table to
        outgrow, but quality past the trained length is not guaranteed."""
        return int(self.cfg.data.seq_len)

    def encode(self, prompt: str) -> list[int]:
        """Prompt ids; an empty prompt starts from the tokenizer's EOS token."""
        return self.tokenizer.encode(prompt) if prompt else [self.tokenizer.eos_id]

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids, without EOS."""
        return self.tokenizer.decode([i for i in ids if i != self.tokenizer.eos_id])

    def generate_ids(self, prompt_ids: list[list[int]], max_new_tokens: int = 100, *,
                     temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     seed: int = 0, max_len: int | None = None,
                     memory_limit: int | None = None, **kw) -> list[list[int]]:
        """:func:`nsa_jax.generate.generate_batch` with this run's vocabulary, EOS and context
        (``max_len`` default :attr:`context`); ``kw``: ``rows_per_group``, ``prefill_chunk``,
        ``steps_per_call``, ``on_token``, ``on_done``, ``timing``."""
        from nsa_jax.generate import generate_batch

        return generate_batch(self.model, prompt_ids, max_new_tokens, temperature=temperature,
                              top_k=top_k, top_p=top_p, seed=seed,
                              vocab_limit=self.tokenizer.vocab_size,
                              eos_id=self.tokenizer.eos_id,
                              max_len=self.context if max_len is None else max_len,
                              memory_limit=memory_limit, **kw)

    def generate(self, prompts: list[str], max_new_tokens: int = 100, *,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 max_len: int | None = None, memory_limit: int | None = None) -> list[str]:
        """Completions (without the prompts) of every prompt, generated in one batch.

        Temperature 0 is greedy; ``top_k`` 0 and ``top_p`` 1 are off. Each row stops at EOS or
        after ``max_new_tokens``. A request that cannot run (a prompt longer than the context,
        prompt + new tokens past it, caches too large for memory) raises
        :class:`nsa_jax.generate.RequestError` naming the argument, before any work."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings, got one string")
        ids = self.generate_ids([self.encode(p) for p in prompts], max_new_tokens,
                                temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                max_len=max_len, memory_limit=memory_limit)
        return [self.decode(x) for x in ids]


def load_run(run_dir, step: int | None = None) -> Run:
    """Load a training run directory: ``config.yaml``, the newest usable checkpoint (or exactly
    ``step``; a corrupt newest one is skipped with a warning, and ``Run.step`` says which was
    loaded) and the tokenizer. Raises ``CheckpointError``/``ConfigError``/``DataError`` with
    one-line messages naming the path or key at fault."""
    from nsa_jax.config import ConfigError
    from nsa_jax.data import get_tokenizer
    from nsa_jax.train.inference import restore_for_inference
    from nsa_jax.train.outputs import RUN_TOKENIZER

    cfg, model, step = restore_for_inference(run_dir, step=step)
    copy = Path(run_dir) / RUN_TOKENIZER      # the run's own copy of a tokenizer.json file
    tok = get_tokenizer(str(copy) if copy.is_file() else cfg.data.tokenizer)
    if tok.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"data.tokenizer: {cfg.data.tokenizer!r} has {tok.vocab_size} "
                          f"tokens but the model's vocab_size is {cfg.model.vocab_size}")
    return Run(run_dir=Path(run_dir), cfg=cfg, model=model, tokenizer=tok, step=int(step))
