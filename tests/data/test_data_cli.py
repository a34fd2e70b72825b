import json

from aleph.cli import main
from aleph.data import open_token_store


def test_smoke_then_tokens_then_sts(work, capsys, tmp_path):
    assert main(["data", "smoke", "--rows", "200"]) == 0
    info = json.loads(capsys.readouterr().out)
    # the directory the trainer uses for smoke_rows=200, so both share one set
    assert info["rows"] == 200
    assert info["captions"].startswith(str(work / "data" / "smoke-200") + "/")
    args = ["data", "tokens", "--captions", info["captions"], "--tokenizer",
            info["tokenizer_dir"], "--max-len", "16"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "built, 200 rows x 16 tokens" in first
    store_dir = first.split(":")[0]
    assert store_dir.startswith(str(work / "cache" / "tokens"))
    assert open_token_store(store_dir).rows == 200
    assert main(args) == 0
    assert "reused" in capsys.readouterr().out
    assert main(["data", "sts", "--n", "5", "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and set(rows[0]) == {"text_a", "text_b", "score"}


def test_missing_tokenizer_exits_with_the_data_error_code(work, capsys, tmp_path):
    (tmp_path / "c.txt").write_text("a dog\n")
    rc = main(["data", "tokens", "--captions", str(tmp_path / "c.txt"), "--tokenizer",
               str(tmp_path / "no-tokenizer")])
    assert rc == 2
    assert "no-tokenizer" in capsys.readouterr().err


def test_sts_bad_arguments_are_one_line_errors(work, capsys, tmp_path):
    assert main(["data", "sts", "--n", "-5"]) == 2
    assert "expected a positive integer" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("keep\n")
    # the --out parent is a file: an OSError that must become a named error, not a traceback
    assert main(["data", "sts", "--n", "3", "--out", str(tmp_path / "a-file" / "p.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aleph data: error: --out ") and "a-file" in err
    assert (tmp_path / "a-file").read_text() == "keep\n"



def test_a_sigterm_while_tokens_builds_exits_76_in_one_line_and_leaves_no_staging(
        work, smoke, capsys, tmp_path, monkeypatch):
    """Two SIGTERMs (as Slurm sends) while the store's manifest is written in its staging
    directory: exit 76, one line naming the command that resumes, no staging left."""
    import signal

    from aleph.data import tokens

    real_write = tokens.atomic_write_json

    def write_under_signals(*a, **kw):
        signal.raise_signal(signal.SIGTERM)  # the handler runs before this returns
        signal.raise_signal(signal.SIGTERM)
        return real_write(*a, **kw)

    monkeypatch.setattr(tokens, "atomic_write_json", write_under_signals)
    out = tmp_path / "cache" / "mine"
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # without a handler: not a death here
    try:
        rc = main(["data", "tokens", "--captions", str(smoke.captions), "--tokenizer",
                   str(smoke.tokenizer_dir), "--max-len", "16", "--out", str(out)])
        late = signal.getsignal(signal.SIGTERM)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    lines = capsys.readouterr().out.splitlines()
    assert rc == 76 and len(lines) == 1, (rc, lines)
    assert lines[0].startswith("aleph data tokens: stopped by SIGTERM before the token store "
                               "was complete: nothing was kept"), lines
    assert f"resume with: aleph data tokens --captions {smoke.captions}" in lines[0]
    assert list(out.parent.iterdir()) == []  # no store, no .mine.* staging directory
    assert late == signal.SIG_IGN  # the process is ending: a later signal must not kill it
