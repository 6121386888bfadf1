"""The Llama-style model of bench/shard_largest_llama.sh, by its hidden size H.

transformers' LlamaForCausalLM: 8 layers of RoPE attention (heads of 128,
half as many key/value heads), SwiGLU (intermediate 8H/3, a multiple of 64)
and RMSNorm, a vocabulary of 4096, untied embeddings; rows of 16 tokens.

    shard_llama.py count H               "values N" (built on the meta device)
    shard_llama.py width P               the largest H (a multiple of 128) of at most P values
    shard_llama.py export DIR H PRECISION LORA PYTHON_DIR
        DIR/model.pt2 (PRECISION 32: float32, bf16-true: exported in bfloat16;
        LORA 1: peft's LoRA, r = 8 on q_proj and v_proj, the base frozen) and
        DIR/train.safetensors; prints "values N trained M"
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

V, T, LAYERS, ROWS = 4096, 16, 8, 64


def config(h):
    heads = max(1, h // 128)
    return LlamaConfig(vocab_size=V, hidden_size=h, intermediate_size=(8 * h // 3 + 63) // 64 * 64,
                       num_hidden_layers=LAYERS, num_attention_heads=heads,
                       num_key_value_heads=heads // 2 if heads % 2 == 0 else heads, max_position_embeddings=T,
                       use_cache=False, tie_word_embeddings=False, pad_token_id=0)


def count(h):
    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(config(h)).parameters())


what = sys.argv[1]
if what == "count":
    print("values", count(int(sys.argv[2])))
elif what == "width":
    p, h = int(sys.argv[2]), 128
    while count(h + 128) <= p:
        h += 128
    print(h)
else:
    out, h, precision, lora = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
    sys.path.insert(0, sys.argv[6])
    import kiln_export
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = LlamaForCausalLM(config(h))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj"]))
    if precision == "bf16-true":  # exported in bfloat16, as docs/training.md says (RMSNorm's casts)
        model = model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (ROWS, T), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    save_file(batch, out + "/train.safetensors")
    kiln_export.export(model, {k: v[:2] for k, v in batch.items()}, out + "/model.pt2")
    print("values", sum(p.numel() for p in model.parameters()),
          "trained", sum(p.numel() for p in model.parameters() if p.requires_grad))
