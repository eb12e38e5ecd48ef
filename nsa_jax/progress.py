"""The progress display of every long-running command (training, ``data.prepare``).

:class:`Progress` is a tqdm bar when its stream is a terminal, else plain lines: what the
caller prints with :meth:`Progress.line`, and :meth:`Progress.update`'s ``status`` at most
every ``every_s`` seconds. ``enabled=False`` silences it (processes other than the first).
"""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int | None, initial: int = 0, *, unit: str = "step",
                 desc: str | None = None, enabled: bool = True, stream=None,
                 every_s: float = 0.0):
        self.total, self.initial, self.unit, self.desc = total, initial, unit, desc
        self.enabled, self.every_s = enabled, every_s
        self.stream = stream if stream is not None else sys.stdout
        self.bar = None
        self.t0 = self.last = time.perf_counter()

    def start(self) -> None:
        """The work starts now (e.g. after compilation): the bar and the rate count from here."""
        self.t0 = self.last = time.perf_counter()
        if self.enabled and self.stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:     # plain lines
                return
            self.bar = tqdm(total=self.total or None, initial=self.initial, file=self.stream,
                            unit=self.unit, dynamic_ncols=True, desc=self.desc)

    def rate(self, done: int) -> float:
        """Units per second since :meth:`start`, ``done`` counted from ``initial``."""
        return (done - self.initial) / max(time.perf_counter() - self.t0, 1e-9)

    def update(self, n: int = 1, status=None, **postfix) -> None:
        """``n`` more units done; on the bar ``postfix`` (not redrawn now), else the line
        ``status()`` when ``every_s`` seconds passed since the last one (no line without it)."""
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(**postfix, refresh=False)
        elif status is not None and time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            self.line(status())

    def show(self, text: str, **postfix) -> None:
        """A status: ``postfix`` on the bar (redrawn now), else the line ``text``."""
        if self.bar is not None:
            self.bar.set_postfix(**postfix, refresh=True)
        else:
            self.line(text)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
