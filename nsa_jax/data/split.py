"""Which documents belong to a split and a process (text and hf sources).

Document ``i`` (raw index in the stream) is held out for eval iff
``floor((i+1) f) > floor(i f)`` with ``f = data.eval_fraction``: exactly a fraction ``f`` of
documents, evenly spread, decidable while streaming (no total count needed). Within a split,
documents are numbered ``j = 0, 1, ...``; process ``p`` of ``P`` keeps those with ``j % P == p``.
So train/eval and different processes never share a document.
"""
from __future__ import annotations

import math


class DocFilter:
    def __init__(self, split: str, eval_fraction: float, process_index: int, process_count: int):
        self.eval = split == "eval"
        self.f = eval_fraction
        self.p, self.P = process_index, process_count

    def is_eval(self, i: int) -> bool:
        return math.floor((i + 1) * self.f) > math.floor(i * self.f)

    def keep(self, i: int) -> bool:
        if self.is_eval(i) != self.eval:
            return False
        n_eval_before = math.floor(i * self.f)
        j = n_eval_before if self.eval else i - n_eval_before
        return j % self.P == self.p
