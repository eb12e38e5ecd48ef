"""bench/peers.py without its optional peers: one clear line, exit status 1 (the GPU run itself
is the lead's command in the report / bench/NOTES.md)."""
import importlib.util
import subprocess
import sys

import pytest

from nsa_testutil import ROOT, cli_env


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None
                    and importlib.util.find_spec("fla") is not None,
                    reason="torch and fla-core are installed here")
def test_peers_without_torch_or_fla_fails_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "bench/peers.py", "--smoke"], cwd=ROOT,
                       env=cli_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("bench/peers.py: needs torch, triton and "
                                                   "fla-core"), r.stderr
