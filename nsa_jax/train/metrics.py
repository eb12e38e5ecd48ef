"""Run outputs for humans and tools: ``metrics.jsonl``, TensorBoard scalars, progress lines.

* :class:`MetricsLog` appends one JSON object per line and flushes it (a non-finite loss or
  gradient norm is written as ``null``; a failed write raises ``WriteFailed``). On resume,
  ``truncate_after(step)`` drops entries past the restored step so no step appears twice.
* :class:`TensorBoardWriter` writes scalar events with TensorBoard's own event writer and protos
  (no TensorFlow, no torch). It first writes a ``SessionLog.START`` at the first new step,
  which tells TensorBoard to discard orphaned events of an interrupted attempt from there on.
* :func:`show_log` puts a log step on the :class:`nsa_jax.progress.Progress` display: loss and
  tok/s on the tqdm bar when stdout is a terminal, else one plain line (with the ETA).
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


class MetricsLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._f = None

    def truncate_after(self, step: int) -> int:
        """Keep only entries with ``step <= step`` (and whole lines). Returns how many were dropped."""
        if not self.path.exists():
            return 0
        kept, dropped = [], 0
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:     # a line cut short by a kill
                dropped += 1
                continue
            if isinstance(entry, dict) and entry.get("step", 0) <= step:
                kept.append(line)
            else:
                dropped += 1
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(l + "\n" for l in kept))
        os.replace(tmp, self.path)
        return dropped

    def write(self, entry: dict) -> None:
        """Append ``entry`` as one JSON line; non-finite numbers become ``null`` (strict JSON).
        A failed write (e.g. a full disk) raises :class:`WriteFailed` naming the file; a line
        it cut short is dropped by the next ``truncate_after``."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in entry.items()}
        try:
            self._append(json.dumps(clean, allow_nan=False) + "\n")
        except OSError as e:
            from nsa_jax.train.errors import WriteFailed
            from nsa_jax.errors import os_reason

            raise WriteFailed(f"run.dir: cannot write {self.path} ({os_reason(e)})") from e

    def _append(self, line: str) -> None:
        if self._f is None:
            self._f = open(self.path, "a")
        self._f.write(line)
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.close()
            except OSError:     # its error was reported by write()
                pass


def read_metrics(path) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


class TensorBoardWriter:
    """Scalars into ``<dir>/events.out.tfevents.*`` via tensorboard's EventFileWriter."""

    def __init__(self, logdir: Path, restart_step: int | None = None):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2 = event_pb2
        self._w = EventFileWriter(str(logdir))
        if restart_step is not None:
            self._w.add_event(event_pb2.Event(
                wall_time=time.time(), step=restart_step,
                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def scalars(self, step: int, values: dict, prefix: str = "") -> None:
        from tensorboard.compat.proto import summary_pb2

        vals = [summary_pb2.Summary.Value(tag=prefix + k, simple_value=float(v))
                for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if vals:
            self._w.add_event(self._event_pb2.Event(wall_time=time.time(), step=step,
                                                    summary=summary_pb2.Summary(value=vals)))

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()


def _num(x, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if x is not None else "nan"


def _skipped(entry: dict) -> str:
    """`` | skipped N (bad streak M)`` when steps were skipped for non-finite values."""
    n, streak = entry.get("skipped_steps") or 0, entry.get("bad_steps") or 0
    if not n:
        return ""
    return f" | skipped {n} non-finite step(s)" + (f", {streak} in a row now" if streak else "")


def final_line(last: dict, steps: int, checkpoint, wall_s: float) -> str:
    """The ``done:`` line: loss, eval loss, skipped steps, training time and wall time
    (start-up and compilation included), the final checkpoint."""
    n = last.get("skipped_steps") or 0
    status = "done" if not n else f"done with {n} of {steps} steps skipped (non-finite)"
    return (f"{status}: step {steps} | loss {_num(last.get('loss'))}"
            + (f" | eval_loss {last['eval_loss']:.4f}" if "eval_loss" in last else "")
            + f" | trained {fmt_duration(last.get('elapsed_s', 0.0))}, {fmt_duration(wall_s)} "
            f"with start-up and compilation | checkpoint {checkpoint}")


def fmt_duration(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def show_log(progress, entry: dict) -> None:
    """A log step on the progress display: loss and tok/s on the bar, else one plain line."""
    s, total = entry["step"], progress.total
    rate = progress.rate(s)
    eta = (total - s) / rate if rate > 0 else float("inf")
    extra = {"skipped": entry["skipped_steps"]} if entry.get("skipped_steps") else {}
    progress.show(f"step {s}/{total} | loss {_num(entry['loss'])} (avg {_num(entry['loss_avg'])})"
                  f" | lr {entry['lr']:.3e} | grad_norm {_num(entry['grad_norm'], 3)} | "
                  f"{entry['tokens_per_s']:,.0f} tok/s | elapsed {fmt_duration(entry['elapsed_s'])}"
                  f" | ETA {fmt_duration(eta)}" + _skipped(entry),
                  loss=f"{entry['loss_avg']:.4f}", tok_s=f"{entry['tokens_per_s']:,.0f}", **extra)
