"""``python -m nsa_jax.generate`` on a stdout whose encoding cannot encode the text
(``PYTHONIOENCODING=cp1252`` and CJK): the text comes out whole, uncodable characters as
backslash escapes, with one warning naming the encoding (before: a UnicodeEncodeError traceback
and the text lost). Uses the tiny run of tests/test_generate.py."""
import io
import subprocess
import sys

from nsa_jax.generate import main
from nsa_testutil import cli_env
from test_generate import REPO, tiny_run  # noqa: F401  (the session's trained run)

PROMPT = "漢字 The history of"          # neither character is in cp1252


def cp1252_main(monkeypatch, argv) -> tuple[int, bytes]:
    """``main(argv)`` with stdout a cp1252 stream (errors="strict", as PYTHONIOENCODING=cp1252
    makes it); returns the status and the bytes written."""
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="cp1252", newline="\n")
    monkeypatch.setattr(sys, "stdout", stdout)
    code = main(argv)
    stdout.flush()
    monkeypatch.undo()
    return code, raw.getvalue()


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_cp1252_stdout_gets_the_whole_text_with_escapes(tiny_run, monkeypatch, capsys):
    args = ["--checkpoint", str(tiny_run), "--max-new-tokens", "16", "--temperature", "1.0",
            "--seed", "3"]
    for prompts in ([PROMPT], [PROMPT, "plain ascii"]):      # streamed; printed per row
        argv = args + [a for p in prompts for a in ("--prompt", p)]
        assert main(argv) == 0                               # the same run to a UTF-8 stdout
        want = capsys.readouterr().out
        assert PROMPT in want

        code, got = cp1252_main(monkeypatch, argv)
        err = capsys.readouterr().err
        assert code == 0, err
        assert "Traceback" not in err and "UnicodeEncodeError" not in err
        assert got == want.encode("cp1252", "backslashreplace")    # nothing lost
        assert b"\\u6f22\\u5b57 The history of" in got
        notes = warnings_in(err)
        bad = sum(1 for c in want if not _in_cp1252(c))
        assert len(notes) == 1, err
        assert notes[0] == (f"warning: stdout's encoding cp1252 cannot encode {bad} "
                            f"character(s) of the text; they were written as backslash escapes "
                            f"(e.g. \\u6f22); set PYTHONIOENCODING=utf-8 to get them as text")


def test_cp1252_stdout_subprocess(tiny_run, tmp_path):
    """The command as a user runs it: PYTHONIOENCODING=cp1252, greedy, one prompt."""
    env = cli_env(tmp_path / "cache") | {"PYTHONIOENCODING": "cp1252"}
    r = subprocess.run([sys.executable, "-m", "nsa_jax.generate", "--checkpoint", str(tiny_run),
                        "--prompt", PROMPT, "--max-new-tokens", "6", "--temperature", "0"],
                       cwd=REPO, env=env, capture_output=True, timeout=600)
    err = r.stderr.decode("cp1252", "replace")
    assert r.returncode == 0, err
    assert "Traceback" not in err
    assert r.stdout.startswith(b"\\u6f22\\u5b57 The history of") and r.stdout.endswith(b"\n")
    assert len(warnings_in(err)) == 1 and "cp1252" in warnings_in(err)[0], err


def test_encodable_output_passes_encodable_text_and_respects_a_stream_handler():
    from nsa_jax.generate_cli import EncodableOutput

    raw = io.BytesIO()
    out = EncodableOutput(io.TextIOWrapper(raw, encoding="cp1252"))
    out.write("café ")                                     # in cp1252: unchanged, no note
    out.flush()
    assert raw.getvalue() == "café ".encode("cp1252") and out.replaced == 0

    raw = io.BytesIO()                                      # PYTHONIOENCODING=cp1252:replace
    stream = io.TextIOWrapper(raw, encoding="cp1252", errors="replace")
    out = EncodableOutput(stream)
    out.write("漢 ok")
    out.flush()
    assert raw.getvalue() == b"? ok" and out.replaced == 0


def _in_cp1252(c: str) -> bool:
    try:
        c.encode("cp1252")
        return True
    except UnicodeEncodeError:
        return False
