"""A byte-level BPE tokenizer trained on the synthetic corpus with the `tokenizers` library.

It is trained with exactly the pipeline of Qwen2's tokenizer (NFC, Qwen2's split regex with
single-digit pieces, byte-level BPE) and saved as a `Qwen2Tokenizer`, so the folder is a standard
HF Qwen2 checkpoint: transformers' AutoTokenizer and vLLM rebuild the same tokenizer from it
(a generic tokenizer class next to a `qwen2` config.json is silently replaced by Qwen2's
pipeline on load). Every protocol tag is one special token, so a stop on `</code>` is a stop
on one id and masks can be set per token.
"""

from __future__ import annotations

import json
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from verifiers.protocol import TAGS

EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, *TAGS]


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> Qwen2Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    floor = len(alphabet) + len(SPECIAL_TOKENS)
    if vocab_size < floor:
        raise ValueError(f"vocab_size {vocab_size} is below the byte alphabet + special tokens ({floor})")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    return Qwen2Tokenizer(vocab=model["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]],
                          additional_special_tokens=list(TAGS), clean_up_tokenization_spaces=False)


def tag_ids(tokenizer) -> dict[str, int]:
    """Tag text -> its single id. Fails loudly if a checkpoint's tokenizer splits a tag."""
    ids = {}
    for tag in TAGS:
        encoded = tokenizer.encode(tag, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"tokenizer splits tag {tag!r} into {len(encoded)} tokens; tags must be single tokens")
        ids[tag] = encoded[0]
    return ids
