"""Loads kiln's weights back into the transformers + peft model, merges the adapter and generates a line.

    python generate.py [PROMPT] [--weights weights.safetensors] [--tokens 24]
"""
import argparse
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from model import tiny_llama_with_lora  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("prompt", nargs="?", default="In the beginning")
parser.add_argument("--weights", default=os.path.join(here, "weights.safetensors"))
parser.add_argument("--tokens", type=int, default=24)
args = parser.parse_args()

model = tiny_llama_with_lora()
model.load_state_dict(load_file(args.weights), strict=True)  # peft's own names, as kiln trained them
model = model.merge_and_unload()  # a plain LlamaForCausalLM, the adapter folded in
model.eval()
tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(here, "tokenizer.json"), pad_token="<pad>")
ids = tokenizer(args.prompt, return_tensors="pt").input_ids
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
print(tokenizer.decode(out[0]))
