"""Writes a Hugging Face tokenizer directory for a Qwen2-family GGUF (byte-level BPE) from
the GGUF's own vocabulary and merges, for clients that tokenize with `transformers`
(lm-eval's `tokenizer=`) where the model's Hugging Face repository cannot be fetched.
scripts/clients_lmeval.py checks that its token ids equal llama.cpp's on every prompt.
Needs `gguf` and `transformers` (lm-eval's virtualenv):

    python scripts/gguf_tokenizer.py MODEL.gguf OUT_DIR"""

from __future__ import annotations

import sys

from gguf import GGUFReader
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

# Qwen2's pre-tokenizer split (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def field(reader: GGUFReader, name: str):
    f = reader.fields[name]
    return [bytes(f.parts[i]).decode() for i in f.data] if len(f.data) > 1 else f.contents()


def main(path: str, out: str) -> None:
    reader = GGUFReader(path)
    if field(reader, "tokenizer.ggml.pre") != "qwen2":
        raise SystemExit(f"{path}: not a Qwen2 tokenizer; this script writes only those")
    tokens = field(reader, "tokenizer.ggml.tokens")
    kinds = list(reader.fields["tokenizer.ggml.token_type"].contents())
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    special = [t for t, k in zip(tokens, kinds) if k == 3]  # llama.cpp's CONTROL tokens
    eos = tokens[int(reader.fields["tokenizer.ggml.eos_token_id"].contents())]
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eos, additional_special_tokens=special)
    fast.save_pretrained(out)
    print(f"{out}: {len(tokens)} tokens, {len(merges)} merges, {len(special)} special")


if __name__ == "__main__":
    main(*sys.argv[1:3])
