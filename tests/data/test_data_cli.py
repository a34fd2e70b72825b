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

