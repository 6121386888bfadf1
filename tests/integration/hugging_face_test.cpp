// The models people fine-tune, from Hugging Face's `transformers` and
// `peft`, exported by python/kiln_export.py with the batch as a tokenizer
// returns it (input_ids, attention_mask, labels) and trained by kiln with no
// Python in the run, against PyTorch itself: a Llama-style causal LM (RoPE,
// RMSNorm, grouped-query attention) on padded batches, with and without
// kiln's activation checkpointing; a BERT-style encoder classifying padded
// token ids with a frozen backbone; a LoRA adapter made by peft; and a
// module with no_grad and autocast regions, a non-persistent buffer and a
// constant. For each, the 20 steps' losses equal an eager loop's on the same
// batches within 1e-5 relative, frozen weights are bitwise unchanged and the
// weights kiln exports load back strictly. The wheel's variant runs these,
// with transformers and peft pinned in its venv (./go).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "checkpoint_sections.hpp"
#include "ckpt/tensor_sections.hpp"
#include "exported_common.hpp"

namespace kiln::test {
namespace {

#define KILN_REQUIRE_TRANSFORMERS(dir)                                                                         \
  do {                                                                                                         \
    KILN_REQUIRE_EXPORTED_PLUGIN();                                                                            \
    const ProcessResult probe = run_script(dir, "probe.py", "import transformers, peft\n", {});                 \
    if (probe.exit_code != 0)                                                                                  \
      GTEST_SKIP() << "no transformers and peft beside the checking Python's torch (./go test --torch wheel " \
                      "installs them)";                                                                        \
  } while (0)

// The models, their data and the eager loops. Arguments: python/, the
// test's directory, then what to do.
const char* kModels = R"PY(
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import kiln_export
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM

dir, model_kind, what = sys.argv[2], sys.argv[3], sys.argv[4]
V, T = 96, 16

def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        use_cache=False, tie_word_embeddings=False, pad_token_id=0))

def bert():
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=64,
                                                    max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0,
                                                    attention_probs_dropout_prob=0.0, pad_token_id=0))

def lora(base):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(1)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))

def frozen_backbone(model):
    for name, p in model.named_parameters():
        if name.startswith("bert.embeddings.") or name.startswith("bert.encoder.layer.0."):
            p.requires_grad_(False)
    return model

def make(kind):
    if kind == "llama":
        return llama()
    if kind == "bert":
        return frozen_backbone(bert())
    return lora(llama())

# Token ids padded at the end (0), each row its own length; labels: the ids
# (-100 at the padding) for a causal LM, a class for the encoder.
def data(n, seed, kind):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (n, T), generator=g)
    mask = torch.ones(n, T, dtype=torch.long)
    for i in range(n):
        mask[i, T - (i * 7) % 6:] = 0
    ids = ids * mask
    labels = (ids[:, 0] % 3) if kind == "bert" else ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}

def optimizer(model, kind):
    trained = [p for p in model.parameters() if p.requires_grad]
    if kind == "bert":
        return torch.optim.SGD(trained, lr=0.1, momentum=0.9, weight_decay=0.01)
    return torch.optim.SGD(trained, lr=0.1)

if what == "export":
    model = make(model_kind)
    torch.save(model.state_dict(), dir + "/init.pt")
    save_file(data(160, 1, model_kind), dir + "/train.safetensors")
    save_file(data(16, 2, model_kind), dir + "/test.safetensors")
    kiln_export.export(model, data(4, 3, model_kind), dir + "/model.pt2")
    if model_kind == "llama":
        # transformers' checkpointing, which export drops: the exporter says so.
        model.gradient_checkpointing_enable()
        kiln_export.export(model, data(4, 3, model_kind), dir + "/checkpointed.pt2")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print("trainable", trainable, "total", sum(p.numel() for p in model.parameters()))
elif what == "export_bf16":  # the model in bfloat16, as a bf16-true fine-tune exports it
    model = make(model_kind).to(torch.bfloat16)
    torch.save(model.state_dict(), dir + "/init.pt")
    save_file(data(160, 1, model_kind), dir + "/train.safetensors")
    save_file(data(16, 2, model_kind), dir + "/test.safetensors")
    kiln_export.export(model, data(4, 3, model_kind), dir + "/model.pt2")
elif what == "eager_bf16":  # bf16-true as docs/training.md says: float32 masters of the trained weights
    torch.set_num_threads(1)
    model = make(model_kind).to(torch.bfloat16)
    model.load_state_dict(torch.load(dir + "/init.pt"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float().requires_grad_() for p in params]
    opt = torch.optim.SGD(masters, lr=0.1)
    batches = data(160, 1, model_kind)
    for i in range(0, 160, 8):
        loss = model(**{k: v[i:i + 8] for k, v in batches.items()}).loss
        loss.backward()
        for m, p in zip(masters, params):
            m.grad, p.grad = p.grad.float(), None
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, params):
                p.copy_(m)
        print("loss", repr(loss.item()))
    torch.save(model.state_dict(), dir + "/eager.pt")
elif what == "compare_bf16":  # kiln's exported weights against the eager loop's and the initial ones
    kiln, eager, init = load_file(dir + "/kiln.safetensors"), torch.load(dir + "/eager.pt"), torch.load(dir + "/init.pt")
    assert set(kiln) == set(eager), (sorted(kiln), sorted(eager))
    model = make(model_kind)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    print("dtypes", sorted({str(t.dtype) for t in kiln.values()}))
    print("frozen", len(frozen), "moved", sum(not torch.equal(kiln[n], init[n]) for n in frozen))
    print("max_abs_diff", max((kiln[k].float() - eager[k].float()).abs().max().item() for k in kiln))
elif what == "eager":
    torch.set_num_threads(1)
    model = make(model_kind)
    model.load_state_dict(torch.load(dir + "/init.pt"))
    model.train()
    opt = optimizer(model, model_kind)
    batches = data(160, 1, model_kind)
    for i in range(0, 160, 8):
        opt.zero_grad()
        loss = model(**{k: v[i:i + 8] for k, v in batches.items()}).loss
        loss.backward()
        if model_kind == "bert":
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.5)
        opt.step()
        print("loss", repr(loss.item()))
else:  # back: kiln's weights into the Python model, strictly, and its predictions
    model = make(model_kind)
    init = torch.load(dir + "/init.pt")
    trained = load_file(dir + "/weights.safetensors")
    model.load_state_dict(trained, strict=True)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    moved = [n for n in frozen if not torch.equal(trained[n], init[n])]
    print("frozen", len(frozen), "moved", len(moved), moved[:3])
    if model_kind == "lora":
        model = model.merge_and_unload()
    model.eval()
    test = data(16, 2, model_kind)
    with torch.no_grad():
        logits = model(input_ids=test["input_ids"], attention_mask=test["attention_mask"]).logits
    want = torch.softmax(logits[:, -1] if logits.dim() == 3 else logits, dim=1)
    got = torch.load(dir + "/run/predictions.pt", weights_only=True)
    print("max_abs_diff", float((want - got).abs().max()))
)PY";

ProcessResult models(const TempDir& dir, const std::string& kind, const std::string& what) {
  return run_script(dir, "models.py", kModels, {kind, what});
}

// A run over the arrays the script wrote: every array by its name.
std::filesystem::path hf_manifest(const TempDir& dir, const std::string& model_extra, const std::string& trainer_extra,
                                  const std::string& optimizer = "name = \"sgd\"\nlr = 0.1\n",
                                  const std::string& extra = "") {
  return write_run_manifest(dir, {.name = "hf",
                                  .run = "seed = 0\nthreads = 1\n",
                                  .model = exported_keys(dir, "model.pt2", model_extra),
                                  .data = "path = \"kiln_arrays\"\ntrain = \"" + (dir / "train.safetensors").string() +
                                          "\"\ntest = \"" + (dir / "test.safetensors").string() + "\"\n",
                                  .trainer = trainer_keys(1, 8, kInOrder + trainer_extra),
                                  .optimizer = optimizer,
                                  .extra = "\n[checkpoint]\n" + extra + kCsvAndJsonl});
}

// kiln's last weights as safetensors, then the script's check of them.
ProcessResult weights_back(const TempDir& dir, const std::string& kind) {
  const auto last = dir / "run" / "checkpoints" / "last.ckpt";
  const ProcessResult exported = kiln({"export", last.string(), "-o", (dir / "weights.safetensors").string(), "--force"});
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  const ProcessResult predicted = kiln({"predict", (dir / "run.toml").string(), "--ckpt", "last"});
  EXPECT_EQ(predicted.exit_code, 0) << predicted.output;
  return models(dir, kind, "back");
}

bool same_parameters(const std::filesystem::path& a, const std::filesystem::path& b) {
  return sections(a / "checkpoints" / "last.ckpt", "param/") == sections(b / "checkpoints" / "last.ckpt", "param/");
}

// The model `kind` exported, trained by kiln (the manifest's defaults) and
// by the eager loop: the same 20 losses. Returns kiln's, and its fit's output.
std::vector<double> trains_as_eager(const TempDir& dir, const std::string& kind, std::string* output = nullptr,
                                    std::string* export_output = nullptr) {
  const ProcessResult exported = models(dir, kind, "export");
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  if (export_output) *export_output = exported.output;
  const ProcessResult fit = kiln_fit(hf_manifest(dir, "", ""), {}, kTimeout);
  EXPECT_EQ(fit.exit_code, 0) << fit.output;
  if (output) *output = fit.output;
  const ProcessResult eager = models(dir, kind, "eager");
  EXPECT_EQ(eager.exit_code, 0) << eager.output;
  const std::vector<double> losses = step_losses(dir / "run" / "metrics.jsonl");
  expect_the_eager_losses(losses, eager);
  return losses;
}

// Another run of the same program and data, in `to`.
void copy_inputs(const TempDir& from, const TempDir& to) {
  for (const char* file : {"model.pt2", "train.safetensors", "test.safetensors"})
    std::filesystem::copy_file(from / file, to / file);
}

TEST(HuggingFace, ALlamaCausalLmOnPaddedBatchesTrainsAsEagerWithAndWithoutActivationCheckpointing) {
  TempDir dir, recomputed;
  KILN_REQUIRE_TRANSFORMERS(dir);
  std::string output, exported;
  const std::vector<double> losses = trains_as_eager(dir, "llama", &output, &exported);
  EXPECT_NE(exported.find("the model has activation checkpointing enabled, which torch.export drops"),
            std::string::npos)
      << exported;
  EXPECT_NE(output.find("aten::scaled_dot_product_attention"), std::string::npos) << output;
  expect_the_same_outputs(weights_back(dir, "llama"));

  // Activation checkpointing: each decoder layer recomputed in backward,
  // the same losses and weights to the bit.
  copy_inputs(dir, recomputed);
  const ProcessResult again =
      kiln_fit(hf_manifest(recomputed, "activation_checkpointing = [\"model.layers.*\"]\n", ""), {}, kTimeout);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("activation checkpointing recomputes"), std::string::npos) << again.output;
  EXPECT_EQ(step_losses(recomputed / "run" / "metrics.jsonl"), losses);
  EXPECT_TRUE(same_parameters(dir / "run", recomputed / "run"));
}

// A BERT-style encoder whose embeddings and first layer are frozen, on
// padded token ids with an attention mask, SGD with momentum and weight
// decay, gradients clipped to a norm of 0.5: the frozen weights are not
// stepped, decayed or counted in the norm (the eager loop's losses), and
// stay bitwise what they were.
TEST(HuggingFace, ABertEncoderWithAFrozenBackboneClassifiesPaddedTokensAsEager) {
  TempDir dir;
  KILN_REQUIRE_TRANSFORMERS(dir);
  const ProcessResult exported = models(dir, "bert", "export");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string sgd = "name = \"sgd\"\nlr = 0.1\nmomentum = 0.9\nweight_decay = 0.01\n";
  // A group that names only frozen parameters: one line, exit 2, nothing written.
  const ProcessResult grouped = kiln_fit(
      hf_manifest(dir, "", "", sgd + "\n[[optimizer.groups]]\nmatch = [\"bert.embeddings.*\"]\nlr = 0.01\n"), {},
      kTimeout);
  EXPECT_EQ(grouped.exit_code, 2) << grouped.output;
  EXPECT_NE(grouped.output.find("leaves the group no parameter to train"), std::string::npos) << grouped.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << grouped.output;
  // A program input bound to a tensor the batches lack: both names, before anything runs.
  const ProcessResult unbound = kiln_fit(hf_manifest(dir, "inputs = { attention_mask = \"mask\" }\n", ""), {}, kTimeout);
  EXPECT_EQ(unbound.exit_code, 2) << unbound.output;
  EXPECT_NE(unbound.output.find("takes input 'attention_mask' (the batch's \"mask\"), and the data module's batches "
                                "have none (they have: "),
            std::string::npos)
      << unbound.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << unbound.output;

  const ProcessResult fit = kiln_fit(hf_manifest(dir, "", "gradient_clip_val = 0.5\n", sgd), {}, kTimeout);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  // The summary's counts are Python's.
  const std::vector<double> counts = printed(exported.output, "trainable");
  ASSERT_EQ(counts.size(), 1u) << exported.output;
  const double total = printed(exported.output, "total").at(0);
  auto short_count = [](double n) {
    char text[32];
    std::snprintf(text, sizeof text, n / 1000 < 10 ? "%.1f K" : "%.0f K", n / 1000);
    return std::string(text);
  };
  EXPECT_NE(fit.output.find(short_count(counts[0]) + std::string(9 - short_count(counts[0]).size(), ' ') +
                            " Trainable params"),
            std::string::npos)
      << fit.output;
  EXPECT_NE(fit.output.find(short_count(total - counts[0])), std::string::npos) << fit.output;
  const ProcessResult eager = models(dir, "bert", "eager");
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  expect_the_eager_losses(step_losses(dir / "run" / "metrics.jsonl"), eager);
  const ProcessResult back = weights_back(dir, "bert");
  expect_the_same_outputs(back);
  EXPECT_NE(back.output.find("moved 0 "), std::string::npos) << back.output;
  EXPECT_EQ(back.output.find("frozen 0 "), std::string::npos) << back.output;
}

// A LoRA adapter made by peft on the Llama: only the adapter's weights
// train (the base's stay bitwise), kiln's weights load back into the PEFT
// model strictly, merge_and_unload() gives kiln predict's outputs, and a
// run stopped mid-epoch and resumed is bitwise the uninterrupted one.
TEST(HuggingFace, ALoraAdapterTrainsItsWeightsOnlyMergesAndResumesBitwise) {
  TempDir dir, resumed;
  KILN_REQUIRE_TRANSFORMERS(dir);
  const std::vector<double> losses = trains_as_eager(dir, "lora");
  const ProcessResult back = weights_back(dir, "lora");
  expect_the_same_outputs(back);
  EXPECT_NE(back.output.find("moved 0 "), std::string::npos) << back.output;
  EXPECT_EQ(back.output.find("frozen 0 "), std::string::npos) << back.output;

  copy_inputs(dir, resumed);
  const std::filesystem::path manifest = hf_manifest(resumed, "", "");
  const ProcessResult stopped = kiln_fit(manifest, {"--set", "trainer.max_steps=13"}, kTimeout);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const ProcessResult rest = kiln_fit(manifest, {"--resume", "last"}, kTimeout);
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_EQ(step_losses(resumed / "run" / "metrics.jsonl"), losses);
  EXPECT_TRUE(same_parameters(dir / "run", resumed / "run"));

  // The same float32 program in bf16-true: its RMSNorm's recorded float32
  // cast meets the bfloat16 weights. Refused before anything is written,
  // saying what to do (the next test exports it in bfloat16).
  TempDir bf16;
  copy_inputs(dir, bf16);
  const ProcessResult refused = kiln_fit(hf_manifest(bf16, "", "precision = \"bf16-true\"\n"), {}, kTimeout);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("the program was exported in Float and runs in BFloat16 here (trainer.precision): "
                                "export the model in that dtype (model.to(torch.bfloat16) before kiln_export.export)"),
            std::string::npos)
      << refused.output;
  EXPECT_FALSE(std::filesystem::exists(bf16 / "run"));
}

// distributed.shard = "parameters" (ZeRO-3) on the LoRA fine-tune: the
// frozen base and the adapter each split between 2 processes, a bucket of
// 10 kB at a time gathered as the interpreter's operators read it, in
// backward too, and again inside each recomputed decoder layer with
// activation checkpointing. The replicated run's losses and weights, to
// the bit, either way.
TEST(HuggingFace, ALoraAdapterOverShardedParametersKeepsTheReplicatedRunsBits) {
  TempDir dir, sharded, recomputed;
  KILN_REQUIRE_TRANSFORMERS(dir);
  const ProcessResult exported = models(dir, "lora", "export");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  copy_inputs(dir, sharded);
  copy_inputs(dir, recomputed);
  const std::vector<std::string> two{"-n", "2"};
  const ProcessResult replicated = kiln_fit(hf_manifest(dir, "", ""), two, kTimeout);
  ASSERT_EQ(replicated.exit_code, 0) << replicated.output;
  const std::vector<std::string> zero3{"-n", "2", "--set", "distributed.shard=parameters", "--set",
                                       "distributed.bucket_mb=0.01"};
  const ProcessResult parameters = kiln_fit(hf_manifest(sharded, "", ""), zero3, kTimeout);
  ASSERT_EQ(parameters.exit_code, 0) << parameters.output;
  EXPECT_NE(parameters.output.find("holds the optimizer's state, the reduced gradients and the parameters"),
            std::string::npos)
      << parameters.output;
  EXPECT_EQ(step_losses(sharded / "run" / "metrics.jsonl"), step_losses(dir / "run" / "metrics.jsonl"));
  EXPECT_TRUE(same_parameters(dir / "run", sharded / "run"));
  const ProcessResult again =
      kiln_fit(hf_manifest(recomputed, "activation_checkpointing = [\"*.layers.*\"]\n", ""), zero3, kTimeout);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("activation checkpointing recomputes"), std::string::npos) << again.output;
  EXPECT_EQ(step_losses(recomputed / "run" / "metrics.jsonl"), step_losses(dir / "run" / "metrics.jsonl"));
  EXPECT_TRUE(same_parameters(dir / "run", recomputed / "run"));
}

// A LoRA fine-tune in trainer.precision = "bf16-true": the Llama exported in
// bfloat16 (exported in float32 it is refused: the test above), its base
// frozen and stored in bfloat16, the adapter
// stepped through float32 masters. An eager loop doing what
// docs/training.md says (model.to(torch.bfloat16), masters, SGD,
// p.copy_(master)) gives the same 20 losses and, to the bit, the same
// weights; the base is bitwise its initial bfloat16 weights.
TEST(HuggingFace, ALoraAdapterInBf16TrueTrainsAsEagerWithFloat32MastersOverAFrozenBfloat16Base) {
  TempDir dir;
  KILN_REQUIRE_TRANSFORMERS(dir);
  const ProcessResult exported = models(dir, "lora", "export_bf16");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const ProcessResult fit = kiln_fit(hf_manifest(dir, "", "precision = \"bf16-true\"\n"), {}, kTimeout);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const ProcessResult eager = models(dir, "lora", "eager_bf16");
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  const std::vector<double> got = step_losses(dir / "run" / "metrics.jsonl"), want = printed(eager.output, "loss");
  ASSERT_EQ(want.size(), 20u) << eager.output;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
  const ProcessResult weights = kiln({"export", (dir / "run" / "checkpoints" / "last.ckpt").string(), "-o",
                                      (dir / "kiln.safetensors").string()});
  ASSERT_EQ(weights.exit_code, 0) << weights.output;
  const ProcessResult compared = models(dir, "lora", "compare_bf16");
  ASSERT_EQ(compared.exit_code, 0) << compared.output;
  EXPECT_NE(compared.output.find("dtypes ['torch.bfloat16']"), std::string::npos) << compared.output;
  EXPECT_NE(compared.output.find(" moved 0"), std::string::npos) << compared.output;
  EXPECT_EQ(compared.output.find("frozen 0 "), std::string::npos) << compared.output;
  const std::vector<double> diff = printed(compared.output, "max_abs_diff");
  ASSERT_EQ(diff.size(), 1u) << compared.output;
  EXPECT_EQ(diff[0], 0.0) << compared.output;
}

// A module with a torch.no_grad() region, a torch.autocast(enabled=False)
// region around a Linear, a buffer registered with persistent=False and a
// tensor made in forward: export records the regions as higher-order
// operators over subgraphs, which kiln runs under their modes. In float32
// and in bf16-mixed (where the region keeps its Linear in float32) the
// losses are an eager loop's, and the weights load back strictly (the
// buffer is not among them, as it is not in the module's state_dict).
const char* kRegions = R"PY(
import sys, torch
from torch import nn
sys.path.insert(0, sys.argv[1])
import kiln_export
from safetensors.torch import load_file, save_file
dir, what = sys.argv[2], sys.argv[3]

class Regions(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.mid, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16), persistent=False)

    def forward(self, x):
        h = self.fc1(x)
        with torch.no_grad():
            gate = torch.sigmoid(h) * self.scale
        with torch.autocast("cpu", enabled=False):
            h = self.mid(torch.tanh(h).float()) * gate
        return self.fc2(h) + torch.tensor([0.1, 0.0, -0.1])

g = torch.Generator().manual_seed(4)
x = torch.randn(160, 8, generator=g)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
if what == "export":
    torch.manual_seed(0)
    model = Regions()
    torch.save(model.state_dict(), dir + "/init.pt")
    save_file({"x": x, "y": y}, dir + "/train.safetensors")
    kiln_export.export(model, x[:4], dir + "/model.pt2")
elif what in ("eager", "eager_bf16"):
    torch.set_num_threads(1)
    model = Regions()
    model.load_state_dict(torch.load(dir + "/init.pt"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(0, 160, 8):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=what == "eager_bf16"):
            out = model(x[i:i + 8])
        loss = nn.functional.cross_entropy(out.float(), y[i:i + 8])
        loss.backward()
        opt.step()
        print("loss", repr(loss.item()))
else:
    model = Regions()
    model.load_state_dict(load_file(dir + "/weights.safetensors"), strict=True)
    print("loaded", sorted(model.state_dict()))
)PY";

TEST(HuggingFace, GradModeAndAutocastRegionsANonPersistentBufferAndAConstantRunAsEager) {
  TempDir dir;
  KILN_REQUIRE_EXPORTED_PLUGIN();
  auto python = [&](const char* what) { return run_script(dir, "regions.py", kRegions, {what}); };
  const ProcessResult exported = python("export");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  for (const std::string precision : {"32", "bf16-mixed"}) {
    SCOPED_TRACE(precision);
    std::filesystem::remove_all(dir / "run");
    write_run_manifest(dir, {.name = "regions",
                             .run = "seed = 0\nthreads = 1\n",
                             .model = exported_keys(dir, "model.pt2"),
                             .data = "path = \"kiln_arrays\"\ntrain = \"" + (dir / "train.safetensors").string() +
                                     "\"\ninput = \"x\"\ntarget = \"y\"\n",
                             .trainer = trainer_keys(1, 8, kInOrder + "precision = \"" + precision + "\"\n"),
                             .optimizer = "name = \"sgd\"\nlr = 0.1\n",
                             .extra = "\n[checkpoint]\n" + kCsvAndJsonl});
    const ProcessResult fit = kiln_fit(dir / "run.toml", {}, kTimeout);
    ASSERT_EQ(fit.exit_code, 0) << fit.output;
    const ProcessResult eager = python(precision == "32" ? "eager" : "eager_bf16");
    ASSERT_EQ(eager.exit_code, 0) << eager.output;
    expect_the_eager_losses(step_losses(dir / "run" / "metrics.jsonl"), eager);
  }
  const auto last = dir / "run" / "checkpoints" / "last.ckpt";
  ASSERT_EQ(kiln({"export", last.string(), "-o", (dir / "weights.safetensors").string()}).exit_code, 0);
  // A checkpointing pattern that names no module: one line, exit 2.
  const ProcessResult unmatched =
      kiln_fit(dir / "run.toml", {"--set", "model.activation_checkpointing=[\"layer.*\"]"}, kTimeout);
  EXPECT_EQ(unmatched.exit_code, 2) << unmatched.output;
  EXPECT_NE(unmatched.output.find("\"layer.*\" matches no module of"), std::string::npos) << unmatched.output;
  EXPECT_NE(unmatched.output.find("fc1"), std::string::npos) << unmatched.output;
  const ProcessResult back = python("back");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_EQ(back.output.find("scale"), std::string::npos) << back.output;
}


// examples/hugging_face/README.md's commands, in order, in a copy of the
// folder: the KJV text from Debian's bible-kjv (fewer lines), a tokenizer
// trained by `tokenizers`, the PEFT model exported with kiln_export.py's
// one command, kiln fit (a few steps), kiln export, and generate.py, which
// loads the weights back strictly, merges the adapter and prints a line
// that begins with the prompt.
TEST(HuggingFace, TheWalkthroughRunsAsItsReadmeSays) {
  TempDir dir;
  KILN_REQUIRE_TRANSFORMERS(dir);
  if (run_process({"/bin/sh", "-c", "command -v bible"}).exit_code != 0)
    GTEST_SKIP() << "no 'bible' program (Debian's bible-kjv, which ./go installs): the walkthrough's text";
  const auto example = source_dir() / "examples" / "hugging_face";
  for (const char* file : {"model.py", "prepare.py", "generate.py", "run.toml"})
    std::filesystem::copy_file(example / file, dir / file);
  const std::string python = check_python().string();
  const ProcessOptions options{.timeout = kTimeout};
  const ProcessResult text = run_process(
      {(source_dir() / "examples" / "charlm" / "prepare.sh").string(), (dir / "kjv.txt").string()}, options);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  const ProcessResult prepared = run_process(
      {python, (dir / "prepare.py").string(), "--text", (dir / "kjv.txt").string(), "--lines", "1500"}, options);
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  const ProcessResult exported =
      run_process({python, (source_dir() / "python" / "kiln_export.py").string(), (dir / "model.py").string(),
                   "tiny_llama_with_lora", "--batch", (dir / "train.safetensors").string(), "-o",
                   (dir / "model.pt2").string()},
                  {.cwd = dir.path(), .timeout = kTimeout});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const ProcessResult fit = kiln({"fit", (dir / "run.toml").string(), "--set", "trainer.max_steps=4", "--set",
                                  "trainer.val_check_interval=2", "--set", "trainer.limit_val_batches=2"},
                                 {.cwd = dir.path(), .timeout = kTimeout});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  EXPECT_NE(fit.output.find("Non-trainable params"), std::string::npos) << fit.output;
  const ProcessResult weights = kiln({"export", "runs/hf-lora/checkpoints/last.ckpt", "-o", "weights.safetensors"},
                                     {.cwd = dir.path(), .timeout = kTimeout});
  ASSERT_EQ(weights.exit_code, 0) << weights.output;
  const ProcessResult line =
      run_process({python, (dir / "generate.py").string(), "In the beginning", "--tokens", "8"}, options);
  ASSERT_EQ(line.exit_code, 0) << line.output;
  EXPECT_NE(line.output.find("In the beginning"), std::string::npos) << line.output;
}

}  // namespace
}  // namespace kiln::test
