import json
import shutil

import pytest

from aleph.data import load_tokenizer, tokenizer_fingerprint, train_wordpiece
from aleph.data.tokenizer import SPECIALS, wordpiece_vocab
from aleph.errors import DataError


def test_loads_through_the_bert_code_path(smoke, smoke_tokenizer):
    from transformers import AutoTokenizer, BertTokenizerFast

    tok = smoke_tokenizer
    assert tok.is_fast and type(tok).__name__ == "BertTokenizer"
    assert [tok.convert_tokens_to_ids(s) for s in SPECIALS] == [0, 1, 2, 3, 4]
    assert tok.pad_token_id == 0
    text = "A Crimson PUPPY leaping on the Shore"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.unk_token_id not in ids
    assert tok.convert_ids_to_tokens(ids)[1:-1] == text.lower().split()
    for cls in (AutoTokenizer, BertTokenizerFast):
        assert cls.from_pretrained(str(smoke.tokenizer_dir))(text)["input_ids"] == ids


def test_unseen_words_split_into_pieces_not_unk(smoke_tokenizer):
    pieces = smoke_tokenizer.tokenize("zebra")
    assert pieces[0] == "z" and all(p.startswith("##") for p in pieces[1:])


def test_vocab_is_deterministic_and_capped():
    caps = ["b a c", "a b", "a", "cc dd dd"]
    vocab = wordpiece_vocab(caps, vocab_size=1024)
    assert vocab == wordpiece_vocab(list(reversed(caps)), vocab_size=1024)
    assert list(vocab)[:5] == list(SPECIALS)
    assert list(vocab)[-2:] == ["dd", "cc"]  # by count, then alphabetical
    assert "cc" not in wordpiece_vocab(caps, vocab_size=len(vocab) - 1)
    with pytest.raises(DataError, match="vocab_size"):
        wordpiece_vocab(caps, vocab_size=6)


def test_fingerprint_ignores_call_state(tmp_path, smoke_tokenizer):
    before = tokenizer_fingerprint(smoke_tokenizer)
    smoke_tokenizer(["a red dog"], padding="max_length", truncation=True, max_length=9)
    assert tokenizer_fingerprint(smoke_tokenizer) == before
    train_wordpiece(["a blue cat", "another"], tmp_path / "t")
    assert tokenizer_fingerprint(load_tokenizer(tmp_path / "t")) != before


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(DataError, match="tokenizer directory .*nope.* does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer("./no/such/tokenizer")


def test_empty_or_corrupt_directory_is_a_one_line_data_error(tmp_path, smoke):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds none of") as e:
        load_tokenizer(tmp_path / "empty")
    assert "\n" not in str(e.value)
    bad = tmp_path / "bad"
    shutil.copytree(smoke.tokenizer_dir, bad)
    (bad / "tokenizer.json").write_text('{"version": "1.0", "garbage": 1}')  # KeyError inside
    with pytest.raises(DataError, match="cannot load tokenizer") as e:
        load_tokenizer(bad)
    assert "\n" not in str(e.value)


def test_tokenizer_threads_follow_the_cgroup_quota_not_the_host(tmp_path, monkeypatch):
    import os

    from aleph.data import tokenizer as tk

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(96)))  # the seed host
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cpu.max").write_text("1785000 100000\n")  # the seed's 17.85 cores
    assert tk.tokenizer_threads(tmp_path) == 17
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core: still one thread
    assert tk.tokenizer_threads(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")  # no quota: the CPUs we may run on
    assert tk.tokenizer_threads(tmp_path) == 96
    monkeypatch.setattr(tk, "tokenizer_threads", lambda: 17)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    assert tk.configure_threads() == "tokenizer threads: 17 (CPU affinity and cgroup quota)"
    assert os.environ["RAYON_NUM_THREADS"] == "17"
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")  # a user's own setting wins
    assert tk.configure_threads() == "tokenizer threads: 3 (RAYON_NUM_THREADS, as set)"


def _copy_without_unk(src, dst) -> None:
    """The saved tokenizer with its [UNK] renamed away (vocabulary, added tokens, config)."""
    dst.mkdir()
    t = json.loads((src / "tokenizer.json").read_text())
    vocab = t["model"]["vocab"]
    vocab["[UXK]"] = vocab.pop("[UNK]")
    t["added_tokens"] = [a for a in t["added_tokens"] if a["content"] != "[UNK]"]
    (dst / "tokenizer.json").write_text(json.dumps(t))
    c = json.loads((src / "tokenizer_config.json").read_text())
    c.pop("unk_token", None)
    c["added_tokens_decoder"] = {k: v for k, v in c.get("added_tokens_decoder", {}).items()
                                 if v["content"] != "[UNK]"}
    (dst / "tokenizer_config.json").write_text(json.dumps(c))


def test_a_tokenizer_that_cannot_encode_every_caption_is_refused_when_loaded(tmp_path):
    """A vocabulary without [UNK] fails on the first unknown character, mid token-store build
    (a traceback after the run directory existed); a directory holding only its
    tokenizer_config.json loads as the 5 specials and trains on all-[UNK] input."""
    import shutil

    from aleph.data.tokenizer import load_tokenizer, train_wordpiece

    train_wordpiece(["a red cat sits on the mat"] * 3, tmp_path / "tok")
    assert len(load_tokenizer(tmp_path / "tok")) > 5
    _copy_without_unk(tmp_path / "tok", tmp_path / "nounk")
    with pytest.raises(DataError, match=r"nounk': cannot encode text \(.*\); expected one that "
                                        r"encodes any caption"):
        load_tokenizer(tmp_path / "nounk")
    (tmp_path / "cfg").mkdir()
    shutil.copy(tmp_path / "tok" / "tokenizer_config.json", tmp_path / "cfg")
    with pytest.raises(DataError, match=r"cfg': its vocabulary holds only its 5 special tokens"):
        load_tokenizer(tmp_path / "cfg")


def test_a_symbolic_link_in_a_tokenizer_directory_is_refused(tmp_path, smoke):
    """docs/trust.md: links in input directories are never followed."""
    tok = tmp_path / "tok"
    shutil.copytree(smoke.tokenizer_dir, tok)
    (tok / "tokenizer.json").rename(tmp_path / "elsewhere.json")
    (tok / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(DataError, match=r"tokenizer\.json is a symbolic link; links are not "
                                        r"followed: copy the file or name its target"):
        load_tokenizer(tok)
