"""Tiny random-initialised teachers of the five E1 architectures, built offline (no hub).

Run with the teacher environment's Python (transformers 4.x):

  python tiny_teachers.py build OUT CAPTIONS.txt   one directory per architecture under OUT:
      a WordPiece tokenizer trained on the captions (tokenizers), a model of 2-3 layers x 32
      built from its config with a fixed seed, saved with save_pretrained (safetensors)
  python tiny_teachers.py encode MODELS CAPTIONS.txt MAX_LEN ROW...
      for every model directory under MODELS, the plain transformers forward of each listed
      caption alone (no padding), mean-pooled and L2-normalised, printed as JSON
      {name: rows}: the reference the extraction is checked against
  python tiny_teachers.py build-encode OUT CAPTIONS.txt MAX_LEN ROW...
      build, then encode the saved models (read back from OUT with from_pretrained, as
      encode does) in the same process: one start of the teacher environment, not two;
      the JSON is the last line of stdout
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AlbertConfig,
    AlbertModel,
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    ModernBertConfig,
    ModernBertModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaModel,
)

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4
WIDTH = 32


def tokenizer(captions: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(captions, trainers.WordPieceTrainer(vocab_size=300,
                                                                special_tokens=SPECIAL))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"])


def models_for(vocab: int) -> dict[str, torch.nn.Module]:
    common = {"vocab_size": vocab, "num_attention_heads": 2, "pad_token_id": 0}
    return {
        "tiny-bert": BertModel(BertConfig(hidden_size=WIDTH, num_hidden_layers=2,
                                          intermediate_size=64, max_position_embeddings=64,
                                          **common)),
        "tiny-modernbert": ModernBertModel(ModernBertConfig(
            hidden_size=WIDTH, num_hidden_layers=3, intermediate_size=48,
            max_position_embeddings=64, cls_token_id=2, sep_token_id=3, bos_token_id=2,
            eos_token_id=3, reference_compile=False, **common)),
        "tiny-roberta": RobertaModel(RobertaConfig(hidden_size=WIDTH, num_hidden_layers=2,
                                                   intermediate_size=64,
                                                   max_position_embeddings=66, **common)),
        "tiny-albert": AlbertModel(AlbertConfig(embedding_size=16, hidden_size=WIDTH,
                                                num_hidden_layers=2, intermediate_size=64,
                                                max_position_embeddings=64, **common)),
        "tiny-distilbert": DistilBertModel(DistilBertConfig(
            vocab_size=vocab, dim=WIDTH, n_layers=2, n_heads=2, hidden_dim=64,
            max_position_embeddings=64, pad_token_id=0)),
    }


def build(out: Path, captions: list[str]) -> None:
    tok = tokenizer(captions)
    torch.manual_seed(0)
    for name, model in models_for(len(tok)).items():
        model.save_pretrained(out / name, safe_serialization=True)
        tok.save_pretrained(out / name)
        print(out / name)


def encode(models_dir: Path, captions: list[str], max_len: int, rows: list[int]) -> None:
    out: dict[str, list] = {}
    for d in sorted(models_dir.iterdir()):
        tok, model = AutoTokenizer.from_pretrained(d), AutoModel.from_pretrained(d)
        with torch.inference_mode():
            for r in rows:
                b = tok(captions[r], truncation=True, max_length=max_len, return_tensors="pt")
                h = model(input_ids=b["input_ids"]).last_hidden_state[0]  # (L, D)
                out.setdefault(d.name, []).append(
                    torch.nn.functional.normalize(h.mean(0), dim=0).tolist())
    print(json.dumps(out))


if __name__ == "__main__":
    caps = Path(sys.argv[3]).read_text(encoding="utf-8").splitlines()
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]), caps)
    elif sys.argv[1] == "build-encode":
        build(Path(sys.argv[2]), caps)
        encode(Path(sys.argv[2]), caps, int(sys.argv[4]), [int(r) for r in sys.argv[5:]])
    else:
        encode(Path(sys.argv[2]), caps, int(sys.argv[4]), [int(r) for r in sys.argv[5:]])
