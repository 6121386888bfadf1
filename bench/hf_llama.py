"""The Llama-style model of bench/hf_llama.sh: its export, data and eager loop.

    hf_llama.py export DIR             model.pt2 and train.safetensors in DIR
    hf_llama.py eager DIR THREADS N    N steps of the eager loop; prints "step_ms <ms>" a step
"""
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

V, T, BATCH, ROWS = 2048, 128, 8, 8 * 40


def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(vocab_size=V, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                    num_key_value_heads=4, max_position_embeddings=T, use_cache=False, pad_token_id=0)
    )


def data():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (ROWS, T), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


what, out = sys.argv[1], sys.argv[2]
if what == "export":
    sys.path.insert(0, sys.argv[3])
    import kiln_export
    from safetensors.torch import save_file

    m = model()
    save_file(data(), out + "/train.safetensors")
    kiln_export.export(m, {k: v[:4] for k, v in data().items()}, out + "/model.pt2")
    print("parameters", sum(p.numel() for p in m.parameters()))
else:
    torch.set_num_threads(int(sys.argv[3]))
    m = model()
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    d = data()
    for step in range(int(sys.argv[4])):
        i = (step * BATCH) % ROWS
        batch = {k: v[i:i + BATCH] for k, v in d.items()}
        start = time.perf_counter()
        opt.zero_grad()
        loss = m(**batch).loss
        loss.backward()
        opt.step()
        print("step_ms", (time.perf_counter() - start) * 1000, flush=True)
