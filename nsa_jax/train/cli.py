"""Command line: ``python -m nsa_jax.train --config configs/X.yaml [key=value ...]``.

Exit statuses (every error is one line ``error: ...`` on stderr naming the key or path;
``--debug`` adds the traceback):

* 0 -- trained to ``train.steps``; or stopped by SIGTERM/SIGINT after writing a checkpoint.
* 1 -- training failed: ``train.max_bad_steps`` non-finite steps in a row, a data source that
  failed after its retries or stalled past ``train.data_timeout_s`` (a checkpoint of the last
  completed step is written first), a run output that cannot be written (disk full), or an
  internal error.
* 2 -- bad input: config, override, command-line argument, data (also bad data found
  mid-run, after a checkpoint), run directory, checkpoint or device layout.
* 3 -- the watchdog: no progress for ``run.watchdog_s`` seconds (stacks dumped).
* 4 -- out of memory (XLA's ``RESOURCE_EXHAUSTED``, ``MemoryError``), on the device or the host:
  the line names the device, the step and the config keys that drive memory (``data.seq_len``,
  ``train.batch_size``, ``train.grad_accum``, ``exec.remat``; :mod:`nsa_jax.train.memory`).
* 130 -- Ctrl-C before training started. A second SIGTERM/SIGINT during training ends the
  process at once with the signal's default action (status 143 / 130 in a shell).

A fresh run that fails before any step is on record (no checkpoint, no metrics line) removes
what it wrote at start-up (``config.yaml``, ``env.json``, ...), and ``run.dir`` when it created
it; a resumed run, or one with a checkpoint, keeps every file
(:func:`nsa_jax.train.outputs.remove_start_outputs`).

The statuses and the one-line helpers are shared with the other CLIs (:mod:`nsa_jax.errors`).
"""
from __future__ import annotations

import argparse
import sys

from nsa_jax.errors import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, OneLineParser,
                            one_line, parse_args, report)

EPILOG = """\
outputs (in run.dir, default runs/<config-name>-<timestamp>):
  config.yaml       the resolved config         env.json      versions, devices, git commit
  metrics.jsonl     one JSON object per log/eval step
  tensorboard/      scalars: tensorboard --logdir <run.dir>
  checkpoints/      orbax checkpoints (every train.ckpt_every steps and at the end)
  profile/          jax.profiler trace (train.profile_steps=[a,b] or --profile)
  heartbeat.json    pid, step and time of the last progress (rewritten every step)
  stacks.txt        all threads' stacks: kill -USR1 <pid>, or the watchdog (run.watchdog_s)
  corrupt_checkpoints/  checkpoints that could not be read back, moved aside on resume

exit status: 0 done, or stopped by SIGTERM/SIGINT after a checkpoint (a second signal exits at
once); 1 training failed (non-finite steps, data source failed/stalled, disk full); 2 bad input;
3 watchdog (no progress for run.watchdog_s); 4 out of memory (lower data.seq_len or
train.batch_size, raise train.grad_accum, or set exec.remat=block)

examples:
  python -m nsa_jax.train --config configs/tiny.yaml
  python -m nsa_jax.train --config configs/tiny.yaml train.steps=300 run.dir=runs/a
  python -m nsa_jax.train --config configs/tiny.yaml run.dir=runs/a run.resume=true train.steps=600

multi-process (one process per host; single-process runs need none of these):
  python -m nsa_jax.train --config C.yaml --distributed run.dir=/shared/run   (SLURM, Open MPI, ...)
  python -m nsa_jax.train --config C.yaml --coordinator host0:1234 --num-processes 2 --process-id 0
"""


class Once(argparse.Action):
    """An option that may be given once (a second ``--config`` would silently win)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} given twice; give one (override single keys with "
                         f"section.key=value)")
        setattr(namespace, self.dest, values)


class HelpWithKeys(argparse.Action):
    """``--help``: the usage, then every config key with its default (imports the config)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from nsa_jax.config import describe_keys

        parser.print_help()
        print("\nconfig keys (section.key=default; override any with section.key=value):")
        print(describe_keys())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m nsa_jax.train", add_help=False,
                      description="Train an NSA (or dense) language model from a YAML config.",
                      epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-h", "--help", action=HelpWithKeys,
                   help="show this help, then every config key with its default, and exit")
    p.add_argument("--config", required=True, action=Once, metavar="PATH",
                   help="YAML config, e.g. configs/tiny.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides with dotted keys, e.g. train.steps=100 run.resume=true")
    p.add_argument("--profile", action="store_true",
                   help="trace a few steps with jax.profiler into run.dir/profile "
                        "(train.profile_steps=[a,b] picks the steps)")
    p.add_argument("--debug", action="store_true", help="show tracebacks with errors")
    g = p.add_argument_group("multi-process")
    g.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() and let it detect the cluster")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="coordinator address (process 0)")
    g.add_argument("--num-processes", type=int, metavar="N")
    g.add_argument("--process-id", type=int, metavar="I")
    return p


def main(argv: list[str] | None = None) -> int:
    """The CLI (module docstring), with stdout and stderr that outlive their reader
    (:mod:`nsa_jax.streams`: a preempted ``train | tee`` still saves its checkpoint)."""
    from nsa_jax.streams import outliving_streams

    with outliving_streams():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, status = parse_args(build_parser(), argv)
    if args is None:
        return status

    from nsa_jax.config import ConfigError, load_config
    from nsa_jax.data import DataError
    from nsa_jax.train.errors import EXIT_OUT_OF_MEMORY, OutOfMemory, TrainError, TrainingFailed

    try:
        notes: list[str] = []
        cfg = load_config(args.config, args.overrides, notes=notes)
        from nsa_jax.train.mesh import init_distributed
        init_distributed(args.distributed, args.coordinator, args.num_processes, args.process_id)
        from nsa_jax.train.loop import train
        train(cfg, profile=args.profile, argv=["python", "-m", "nsa_jax.train", *argv],
              notes=notes)
        return 0
    except (ConfigError, DataError, TrainError) as e:
        return report(one_line(e), EXIT_BAD_INPUT, args.debug)
    except OutOfMemory as e:
        return report(one_line(e), EXIT_OUT_OF_MEMORY, args.debug)
    except TrainingFailed as e:
        return report(one_line(e), EXIT_FAILED, args.debug)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (the newest complete checkpoint is intact; resume with "
                         "run.resume=true)\n")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a bug: one line unless --debug
        hint = "" if args.debug else " (rerun with --debug for the traceback)"
        return report(f"internal error: {type(e).__name__}: {one_line(e)}{hint}", EXIT_FAILED,
                      args.debug)
