"""aleph.data: captions, tokenizers, the token store and the embedded smoke data set."""

from aleph.data.captions import CaptionSource, check_row_counts, load_captions, open_captions
from aleph.data.smoke import SmokeData, ensure_smoke_data, sts_pairs
from aleph.data.tokenizer import load_tokenizer, tokenizer_fingerprint, train_wordpiece
from aleph.data.tokens import TokenStore, build_token_store, open_token_store

__all__ = [
    "CaptionSource", "SmokeData", "TokenStore", "build_token_store", "check_row_counts",
    "ensure_smoke_data", "load_captions", "load_tokenizer", "open_captions", "open_token_store",
    "sts_pairs", "tokenizer_fingerprint", "train_wordpiece",
]
