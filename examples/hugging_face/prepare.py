"""Trains a byte-level BPE tokenizer on the KJV text and writes the data kiln trains on.

    python prepare.py [--text ../charlm/kjv.txt] [--lines N] [--block 64]

writes, beside this script:
  tokenizer.json                      the tokenizer (Hugging Face `tokenizers`)
  train.safetensors, val.safetensors  input_ids, attention_mask, labels: int64 [rows, block]

Nothing is downloaded: the text is Debian's bible-kjv (../charlm/prepare.sh).
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

here = os.path.dirname(os.path.abspath(__file__))
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--text", default=os.path.join(here, "..", "charlm", "kjv.txt"))
parser.add_argument("--lines", type=int, default=0, help="only the first N lines (0: all)")
parser.add_argument("--block", type=int, default=64, help="tokens a row")
parser.add_argument("--vocab", type=int, default=1024)
parser.add_argument("--out", default=here)
args = parser.parse_args()

with open(args.text, encoding="utf-8") as f:
    lines = f.read().splitlines()
if args.lines:
    lines = lines[: args.lines]
text = "\n".join(lines)

tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
tokenizer.train_from_iterator(
    [text[i : i + 4096] for i in range(0, len(text), 4096)],
    trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
)
tokenizer.save(os.path.join(args.out, "tokenizer.json"))

ids = torch.tensor(tokenizer.encode(text).ids, dtype=torch.long)
rows = ids[: ids.numel() // args.block * args.block].view(-1, args.block)
held = max(1, rows.shape[0] // 20)
for name, part in (("train", rows[held:]), ("val", rows[:held])):
    # Every row is full: the mask is all ones and the labels are the ids
    # (the model shifts them by one itself).
    save_file(
        {"input_ids": part.clone(), "attention_mask": torch.ones_like(part), "labels": part.clone()},
        os.path.join(args.out, f"{name}.safetensors"),
    )
print(f"prepare.py: {tokenizer.get_vocab_size()} tokens, {rows.shape[0] - held} train and {held} val rows of {args.block}")
