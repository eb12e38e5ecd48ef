"""How ``python -m nsa_jax.generate`` ends when Ctrl-C lands during its start-up (compiles):
SIGINT sent to a child after each given delay; prints each child's exit status (130 expected;
-11 is the SIGSEGV of jaxlib's teardown after an interrupted compile, bench/NOTES.md, forty-sixth
session) and the bytes it wrote to stdout. The child's SIGINT is reset to the default action,
as a terminal's would be (a background shell job ignores SIGINT).

    python bench/sigint_generate.py RUN_DIR 2.5 3 3.5 4 5
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    run, delays = argv[0], [float(x) for x in argv[1:]]
    for delay in delays:
        p = subprocess.Popen([sys.executable, "-m", "nsa_jax.generate", "--checkpoint", run,
                              "--prompt", "Hello", "--max-new-tokens", "250", "--steps-per-call",
                              "1", "--temperature", "0.8"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate()
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        print(f"SIGINT after {delay:.1f}s: status {p.returncode}, stdout {len(out)} B, "
              f"stderr tail {tail[0][-120:]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
