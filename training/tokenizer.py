"""A BPE tokenizer trained on the synthetic corpus with the `tokenizers` library.

Digits, operators and whitespace are single-character pieces (arithmetic needs digit-level
tokens); letter runs merge into words. Every protocol tag is one special token, so a stop on
`</code>` is a stop on one id and masks can be set per token. Saved as a standard HF folder
(`tokenizer.json` + config) that transformers and vLLM load.
"""

from __future__ import annotations

import string
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from verifiers.protocol import TAGS

EOS = "<|endoftext|>"
UNK = "<unk>"
SPECIAL_TOKENS = [EOS, UNK, *TAGS]
ALPHABET = sorted(set(string.printable) - set("\r\x0b\x0c"))


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    floor = len(ALPHABET) + len(SPECIAL_TOKENS)
    if vocab_size < floor:
        raise ValueError(f"vocab_size {vocab_size} is below the alphabet + special tokens ({floor})")
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^A-Za-z]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=ALPHABET, show_progress=False
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(TAGS),
        clean_up_tokenization_spaces=False,
    )


def tag_ids(tokenizer) -> dict[str, int]:
    """Tag text -> its single id. Fails loudly if a checkpoint's tokenizer splits a tag."""
    ids = {}
    for tag in TAGS:
        encoded = tokenizer.encode(tag, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"tokenizer splits tag {tag!r} into {len(encoded)} tokens; tags must be single tokens")
        ids[tag] = encoded[0]
    return ids
