"""A small Llama-style causal LM (RoPE, RMSNorm, grouped-query attention) with a LoRA adapter.

kiln_export.py builds it with `tiny_llama_with_lora()`; generate.py builds the
same one to load kiln's weights back. With a pretrained model, start from
LlamaForCausalLM.from_pretrained(...) instead: the rest is the same.
"""
import json
import os

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

here = os.path.dirname(os.path.abspath(__file__))


def tiny_llama_with_lora():
    with open(os.path.join(here, "tokenizer.json"), encoding="utf-8") as f:
        vocab = len(json.load(f)["model"]["vocab"])
    torch.manual_seed(0)
    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            use_cache=False,  # training: no key/value cache in the program
            pad_token_id=0,
        )
    )
    # The adapter trains; the base's weights stay frozen (kiln keeps them bitwise).
    return get_peft_model(
        base,
        LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    )
