"""A byte-level BPE tokenizer trained on the synthetic corpus with the `tokenizers` library.

It is trained with exactly the pipeline of Qwen2's tokenizer (NFC, Qwen2's split regex with
single-digit pieces, byte-level BPE) and saved as a `Qwen2Tokenizer`, so the folder is a standard
HF Qwen2 checkpoint: transformers' AutoTokenizer and vLLM rebuild the same tokenizer from it
(a generic tokenizer class next to a `qwen2` config.json is silently replaced by Qwen2's
pipeline on load). Every protocol tag is one special token: the agent loop's single-token fast
path (a stop on `</code>` is a stop on one id). Real tokenizers split the tags, and the protocol
works on their text (training/agent/loop.py). The tokenizer carries a chat template (PLAIN_TEMPLATE,
training/agent/chat.py) so that prompts take the same path as a pretrained model's.
"""

from __future__ import annotations

import json
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from training.agent.chat import PLAIN_TEMPLATE
from verifiers.protocol import TAGS

EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, *TAGS]


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_TOKENS = ["<|im_start|>", "<|im_end|>"]


def train_tokenizer(corpus: Iterable[str], vocab_size: int, *, tags_as_tokens: bool = True) -> Qwen2Tokenizer:
    """The scratch tokenizer. `tags_as_tokens=False` gives the shape of a real instruct model's
    tokenizer instead (Qwen2.5's: ChatML markers as special tokens, `<|im_end|>` as EOS, the
    protocol's tags as plain text that splits into several tokens): the gpu profile's path, on a
    model small enough for tests."""
    corpus = list(corpus)
    if not tags_as_tokens:
        tok = _train(corpus, vocab_size, [EOS, *CHATML_TOKENS], additional_special_tokens=CHATML_TOKENS)
        tok.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": EOS})
        tok.chat_template = CHATML_TEMPLATE
        return tok
    trained = _train(corpus, vocab_size, SPECIAL_TOKENS, additional_special_tokens=list(TAGS))
    trained.chat_template = PLAIN_TEMPLATE
    return trained


def _train(corpus: list[str], vocab_size: int, special_tokens: list[str], **kwargs) -> Qwen2Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    floor = len(alphabet) + len(special_tokens)
    if vocab_size < floor:
        raise ValueError(f"vocab_size {vocab_size} is below the byte alphabet + special tokens ({floor})")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]],
        clean_up_tokenization_spaces=False,
        **kwargs,
    )


def tag_tokens(tokenizer) -> dict[str, list[int]]:
    """Tag text -> the ids it encodes to (one on the scratch tokenizer, several on a real one)."""
    return {tag: tokenizer.encode(tag, add_special_tokens=False) for tag in TAGS}


def tag_ids(tokenizer) -> dict[str, int]:
    """Tag text -> its single id, for code that needs single-token tags (the TRL side-by-side
    benchmark's EOS list). Fails loudly if the tokenizer splits a tag."""
    ids = {}
    for tag in TAGS:
        encoded = tokenizer.encode(tag, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"tokenizer splits tag {tag!r} into {len(encoded)} tokens; tags must be single tokens")
        ids[tag] = encoded[0]
    return ids
