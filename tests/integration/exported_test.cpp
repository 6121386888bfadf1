// kiln_exported (plugins/exported) against PyTorch itself: a model written
// in Python (an MLP with BatchNorm and Dropout), exported by
// python/kiln_export.py, trained by kiln with no Python in the run. From the
// same initial weights and the same batches kiln's per-step losses are a
// plain PyTorch eager loop's; the weights kiln exports load into the Python
// module with load_state_dict(strict=True), and its eval outputs are kiln's
// predictions; with dropout the same seed gives the same losses run to run;
// a mid-epoch resume is bitwise the uninterrupted run. What kiln cannot run
// is refused in one line, exit 2. LibTorch 2.x only: the wheel's variant
// runs these (against Debian's 1.13 the plugin is not built, and they skip).
#include <gtest/gtest.h>

#include <cmath>

#include <ATen/ATen.h>

#include "checkpoint_sections.hpp"
#include "ckpt/tensor_sections.hpp"
#include "common.hpp"
#include "exported_common.hpp"
#include "logged_files.hpp"
#include "parameters_within.hpp"

namespace kiln::test {
namespace {

// The model, its data and its export, written by the checking Python (the
// torch wheel's): model.pt2, init.pt (the initial state_dict), train.safetensors
// (x, y: 160 rows) and test.safetensors (x, y: 40 rows).
const char* kModel = R"PY(
import sys, torch
from torch import nn
sys.path.insert(0, sys.argv[1])
import kiln_export

class Net(nn.Module):
    def __init__(self, p, bn=True):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16) if bn else nn.Identity()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())
)PY";

const char* kExport = R"PY(
dropout = float(sys.argv[3])
torch.manual_seed(0)
model = Net(dropout, bn=len(sys.argv) < 5 or sys.argv[4] == "bn")
torch.save(model.state_dict(), sys.argv[2] + "/init.pt")
from safetensors.torch import save_file
for split, n, seed in (("train", 160, 1), ("test", 40, 2)):
    x, y = data(n, seed)
    save_file({"x": x, "y": y}, f"{sys.argv[2]}/{split}.safetensors")
kiln_export.export(model, data(4, 3)[0], sys.argv[2] + "/model.pt2")
print("exported")
)PY";

// The eager loop: the same batches in order (kiln with shuffle = false),
// SGD, one thread as kiln runs. Prints one loss a step.
const char* kEager = R"PY(
torch.set_num_threads(1)
model = Net(0.0)
model.load_state_dict(torch.load(sys.argv[2] + "/init.pt"))
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = data(160, 1)
for epoch in range(2):
    for i in range(0, 160, 16):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i:i + 16]), y[i:i + 16])
        loss.backward()
        opt.step()
        print("loss", repr(loss.item()))
)PY";

// kiln's exported weights into the Python module, strictly, and its eval
// outputs against kiln's predictions.
const char* kRoundTrip = R"PY(
from safetensors.torch import load_file
model = Net(0.0)
state = load_file(sys.argv[2] + "/weights.safetensors")
model.load_state_dict(state, strict=True)
model.eval()
x, _ = data(40, 2)
with torch.no_grad():
    want = torch.softmax(model(x), dim=1)
got = torch.load(sys.argv[4], weights_only=True)
print("max_abs_diff", float((want - got).abs().max()))
print("running_mean_norm", float(model.bn.running_mean.norm()), "batches_tracked", int(model.bn.num_batches_tracked))
)PY";

// The MLP's script: its model and data, then `body`.
ProcessResult python(const TempDir& dir, const std::string& body, const std::vector<std::string>& args) {
  return run_script(dir, "script.py", std::string(kModel) + body, args);
}

std::filesystem::path manifest(const TempDir& dir, const std::string& extra = "") {
  return write_run_manifest(dir, {.name = "exported",
                                  .run = "seed = 0\nthreads = 1\n",
                                  .model = exported_keys(dir, "model.pt2"),
                                  .data = "path = \"kiln_arrays\"\ntrain = \"" + (dir / "train.safetensors").string() +
                                          "\"\ntest = \"" + (dir / "test.safetensors").string() +
                                          "\"\ninput = \"x\"\ntarget = \"y\"\n",
                                  .trainer = trainer_keys(2, 16, kInOrder + extra),
                                  .optimizer = "name = \"sgd\"\nlr = 0.1\n",
                                  .extra = "\n[checkpoint]\n" + kCsvAndJsonl});
}

TEST(Exported, AnMlpWithBatchNormTrainsAsEagerPyTorchAndItsWeightsLoadBack) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  const ProcessResult exported = python(dir, kExport, {"0.0"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const ProcessResult fit = kiln_fit(manifest(dir), {}, kTimeout);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  EXPECT_NE(fit.output.find("aten::batch_norm"), std::string::npos) << fit.output;

  const ProcessResult eager = python(dir, kEager, {});
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  expect_the_eager_losses(step_losses(dir / "run" / "metrics.jsonl"), eager);

  // The round trip: kiln's weights into the Python module, and its outputs.
  const auto last = dir / "run" / "checkpoints" / "last.ckpt";
  const ProcessResult weights = kiln({"export", last.string(), "-o", (dir / "weights.safetensors").string()});
  ASSERT_EQ(weights.exit_code, 0) << weights.output;
  const ProcessResult predicted = kiln({"predict", (dir / "run.toml").string(), "--ckpt", "last"});
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  const ProcessResult back =
      python(dir, kRoundTrip, {"0.0", (dir / "run" / "predictions.pt").string()});
  expect_the_same_outputs(back);
  // BatchNorm's statistics were trained (updated in place by the program).
  EXPECT_NE(back.output.find("batches_tracked 20"), std::string::npos) << back.output;
}

TEST(Exported, WithDropoutTheSameSeedGivesTheSameLossesAndAResumeIsBitwise) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir a, b;
  for (const TempDir* dir : {&a, &b}) {
    const ProcessResult exported = python(*dir, kExport, {"0.3"});
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
  }
  ASSERT_EQ(kiln_fit(manifest(a), {}, kTimeout).exit_code, 0);
  // b stops inside epoch 1 and resumes.
  const ProcessResult stopped = kiln_fit(manifest(b), {"--set", "trainer.max_steps=13"}, kTimeout);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const ProcessResult resumed = kiln_fit(manifest(b), {"--resume", "last"}, kTimeout);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto la = step_losses(a / "run" / "metrics.jsonl"), lb = step_losses(b / "run" / "metrics.jsonl");
  ASSERT_EQ(la.size(), 20u);
  EXPECT_EQ(la, lb);
  EXPECT_TRUE(sections(a / "run" / "checkpoints" / "last.ckpt", "param/") ==
              sections(b / "run" / "checkpoints" / "last.ckpt", "param/"));
  // Dropout is on: the losses differ from the same model without it.
  TempDir c;
  ASSERT_EQ(python(c, kExport, {"0.0"}).exit_code, 0);
  ASSERT_EQ(kiln_fit(manifest(c), {}, kTimeout).exit_code, 0);
  EXPECT_NE(step_losses(c / "run" / "metrics.jsonl"), la);
}

// Data parallelism and precision, as for a C++ model: 2 processes with
// batch 8 end where 1 with batch 16 does (to the 1e-5 docs/distributed.md
// states; no BatchNorm, whose statistics are per rank), with data workers;
// bf16-mixed autocasts the program's operators and trains to about the
// same losses.
TEST(Exported, TwoProcessesMatchOneAndBf16MixedTrains) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir one, two, bf16;
  for (const TempDir* dir : {&one, &two, &bf16}) {
    const ProcessResult exported = python(*dir, kExport, {"0.0", "no_bn"});
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
  }
  ASSERT_EQ(kiln_fit(manifest(one), {}, kTimeout).exit_code, 0);
  const ProcessResult r = kiln_fit(manifest(two), {"-n", "2", "--set", "trainer.batch_size=8", "--set",
                                                   "trainer.data_workers=2"}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(expect_parameters_within(one / "run" / "checkpoints" / "last.ckpt",
                                     two / "run" / "checkpoints" / "last.ckpt", 1e-5),
            4);
  const ProcessResult mixed = kiln_fit(manifest(bf16), {"--set", "trainer.precision=\"bf16-mixed\""}, kTimeout);
  ASSERT_EQ(mixed.exit_code, 0) << mixed.output;
  EXPECT_NE(mixed.output.find("precision bf16-mixed"), std::string::npos) << mixed.output;
  const auto want = step_losses(one / "run" / "metrics.jsonl"), got = step_losses(bf16 / "run" / "metrics.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.05 * want[i] + 0.01) << "step " << i + 1;
}

// A GPT-style decoder written in the test (token and position embeddings,
// LayerNorm, causal scaled_dot_product_attention over split heads, a head
// tied to the token embedding), exported and trained on kiln_token_stream:
// its 20 steps' losses are an eager PyTorch loop's over the same windows.
// Its modes: export, eager (float32, SGD), and for bf16-true (below)
// export_frozen (the position embedding and the first block frozen),
// eager_bf16 (that model in bfloat16, float32 masters stepped by SGD with
// momentum) and compare (kiln's exported weights against eager_bf16's).
const char* kGpt = R"PY(
import math, sys, torch
from torch import nn
from torch.nn import functional as F
sys.path.insert(0, sys.argv[1])
import kiln_export

V, T, D, H = 256, 32, 32, 2

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, D))
        return x + self.mlp(self.ln2(x))

class Gpt(nn.Module):
    def __init__(self, frozen):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln = nn.LayerNorm(D)
        if frozen:
            self.pos.weight.requires_grad_(False)
            self.blocks[0].requires_grad_(False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln(x), self.tok.weight)  # the head tied to the embedding

dir, what = sys.argv[2], sys.argv[3]
frozen = what in ("export_frozen", "eager_bf16", "eager_bf16_adam")
text = (b"In the beginning was the word, and the word was with kiln. " * 40)
if what.startswith("export"):
    open(dir + "/tokens.txt", "wb").write(text)
    torch.manual_seed(0)
    model = Gpt(frozen)
    torch.save(model.state_dict(), dir + "/init.pt")
    kiln_export.export(model, torch.zeros(2, T, dtype=torch.long), dir + "/model.pt2")
elif what.startswith("eager"):
    torch.set_num_threads(1)
    model = Gpt(frozen)
    model.load_state_dict(torch.load(dir + "/init.pt"))
    if what == "eager_bf16":
        model = model.to(torch.bfloat16)
        params = [p for p in model.parameters() if p.requires_grad]
        masters = [p.detach().float().requires_grad_() for p in params]
        opt = torch.optim.SGD(masters, lr=0.1, momentum=0.9)
    elif what == "eager_bf16_adam":  # Lightning's bf16-true: the bfloat16 weights stepped, no masters
        model = model.to(torch.bfloat16)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01, fused=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.tensor(list(text), dtype=torch.long)
    for epoch in range(2):
        for b in range(10):
            x = torch.stack([tokens[i:i + T] for i in range(8 * b, 8 * b + 8)])
            y = torch.stack([tokens[i + 1:i + T + 1] for i in range(8 * b, 8 * b + 8)])
            opt.zero_grad()
            loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
            loss.backward()
            if what == "eager_bf16":
                for m, p in zip(masters, params):
                    m.grad, p.grad = p.grad.float(), None
            opt.step()
            if what == "eager_bf16":
                with torch.no_grad():
                    for m, p in zip(masters, params):
                        p.copy_(m)
            print("loss", repr(loss.item()))
    torch.save(model.state_dict(), dir + "/eager.pt")
else:  # compare: kiln's exported weights with the eager loop's
    from safetensors.torch import load_file
    kiln, eager = load_file(dir + "/kiln.safetensors"), torch.load(dir + "/eager.pt")
    assert set(kiln) == set(eager), (sorted(kiln), sorted(eager))
    print("dtypes", sorted({str(t.dtype) for t in kiln.values()}))
    print("max_abs_diff", max((kiln[k].float() - eager[k].float()).abs().max().item() for k in kiln))
    init = torch.load(dir + "/init.pt")  # how far kiln is from the eager weights, against how far those moved
    moved = sum((eager[k].float() - init[k].float()).abs().sum().item() for k in kiln)
    print("relative_diff", sum((kiln[k].float() - eager[k].float()).abs().sum().item() for k in kiln) / moved)
)PY";

// The decoder's run: 2 epochs of 10 batches of 8 windows, in order, each
// step logged.
void gpt_manifest(const TempDir& dir, const std::string& trainer_more, const std::string& optimizer,
                  const std::string& extra) {
  write_run_manifest(dir, {.name = "gpt",
                           .run = "seed = 0\nthreads = 1\n",
                           .model = exported_keys(dir, "model.pt2"),
                           .data = "path = \"kiln_token_stream\"\nfile = \"" + (dir / "tokens.txt").string() +
                                   "\"\nblock_size = 32\nval_fraction = 0.1\n",
                           .trainer = trainer_keys(2, 8, kInOrder + "limit_train_batches = 10\n" + trainer_more),
                           .optimizer = optimizer,
                           .extra = kCsvAndJsonl + extra});
}

TEST(Exported, AGptDecoderTrainsAsEagerPyTorchOnATokenStream) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  auto run_python = [&](const char* what) { return run_script(dir, "gpt.py", kGpt, {what}); };
  const ProcessResult exported = run_python("export");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  gpt_manifest(dir, "", "name = \"sgd\"\nlr = 0.1\n", "");
  const ProcessResult fit = kiln_fit(dir / "run.toml", {}, kTimeout);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  EXPECT_NE(fit.output.find("aten::scaled_dot_product_attention"), std::string::npos) << fit.output;
  const ProcessResult eager = run_python("eager");
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  expect_the_eager_losses(step_losses(dir / "run" / "metrics.jsonl"), eager);
  // Validated per token.
  EXPECT_GT(last_value(read_metrics(dir / "run" / "metrics.csv"), "val/loss"), 0) << fit.output;
}

// A bf16-true run of the decoder with a frozen part (the position
// embedding and the first block exported with requires_grad false) and
// the eager loop `eager` runs on the same model: both runs' 20 losses, the
// fit's output and the comparison of kiln's exported weights with the
// eager loop's (`compare`).
struct Bf16GptRuns {
  std::string fit;
  std::vector<double> kiln_losses, eager_losses;
  std::string compared;
};

Bf16GptRuns bf16_gpt_runs(const TempDir& dir, const std::string& trainer_more, const std::string& optimizer,
                          const char* eager) {
  Bf16GptRuns out;
  auto run_python = [&](const char* what) { return run_script(dir, "gpt.py", kGpt, {what}); };
  const ProcessResult exported = run_python("export_frozen");
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  gpt_manifest(dir, "precision = \"bf16-true\"\n" + trainer_more, optimizer, "\n[checkpoint]\n");
  const ProcessResult fit = kiln_fit(dir / "run.toml", {}, kTimeout);
  EXPECT_EQ(fit.exit_code, 0) << fit.output;
  out.fit = fit.output;
  const ProcessResult eager_run = run_python(eager);
  EXPECT_EQ(eager_run.exit_code, 0) << eager_run.output;
  out.kiln_losses = step_losses(dir / "run" / "metrics.jsonl");
  out.eager_losses = printed(eager_run.output, "loss");
  EXPECT_EQ(out.eager_losses.size(), 20u) << eager_run.output;
  const ProcessResult exported_weights =
      kiln({"export", (dir / "run" / "checkpoints" / "last.ckpt").string(), "-o", (dir / "kiln.safetensors").string()});
  EXPECT_EQ(exported_weights.exit_code, 0) << exported_weights.output;
  const ProcessResult compared = run_python("compare");
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
  EXPECT_NE(compared.output.find("dtypes ['torch.bfloat16']"), std::string::npos) << compared.output;
  out.compared = compared.output;
  return out;
}

// trainer.precision = "bf16-true" on the same decoder with a frozen part:
// an eager PyTorch loop doing what kiln documents
// (module.to(torch.bfloat16), float32 masters of the trained weights that
// SGD with momentum steps, each weight its master rounded) gives the same
// 20 losses and, to the bit, the same weights, which `kiln export` writes
// as bfloat16, frozen ones too: the model's bytes halve (the summary says
// so).
TEST(Exported, AGptDecoderInBf16TrueWithAFrozenPartTrainsAsEagerPyTorchWithFloat32Masters) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  const Bf16GptRuns runs = bf16_gpt_runs(dir, "", "name = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n", "eager_bf16");
  // 34,688 values, 13,728 of them frozen, at 2 bytes each (float32: 0.132 MiB).
  EXPECT_NE(runs.fit.find("14 K      Non-trainable params"), std::string::npos) << runs.fit;
  EXPECT_NE(runs.fit.find("0.066     Total estimated model params size (MiB)"), std::string::npos) << runs.fit;
  ASSERT_EQ(runs.kiln_losses.size(), runs.eager_losses.size());
  for (size_t i = 0; i < runs.eager_losses.size(); ++i)
    EXPECT_EQ(runs.kiln_losses[i], runs.eager_losses[i]) << "step " << i + 1;
  const std::vector<double> diff = printed(runs.compared, "max_abs_diff");
  ASSERT_EQ(diff.size(), 1u) << runs.compared;
  EXPECT_EQ(diff[0], 0.0) << runs.compared;
}

// trainer.master_weights = false on the same decoder: Lightning's
// bf16-true, the optimizer stepping the bfloat16 weights with bfloat16
// moments. An eager loop doing that (module.to(torch.bfloat16),
// torch.optim.Adam(fused=True) over the trained weights: each element in
// float32, rounded once, as kiln's step) gives the same losses and weights,
// within the rounding below.
TEST(Exported, AGptDecoderInBf16TrueWithoutMasterWeightsTrainsAsEagerPyTorchsBf16Adam) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  const Bf16GptRuns runs =
      bf16_gpt_runs(dir, "master_weights = false\n", "name = \"adam\"\nlr = 0.01\n", "eager_bf16_adam");
  EXPECT_NE(runs.fit.find("no master weights"), std::string::npos) << runs.fit;
  ASSERT_EQ(runs.kiln_losses.size(), runs.eager_losses.size());
  // The first steps to the bit; then a float32 difference in the order of
  // the step's operations rounds a bfloat16 weight the other way now and
  // then (kiln's fused AdamW against PyTorch's: 94 of 101,232 weights after
  // 50 steps, unit.FusedAdam.*), and training amplifies it: measured, losses
  // one bfloat16 spacing apart at 4 of 20 steps (at most 0.6 %), weights
  // 0.24 % of their movement apart.
  for (size_t i = 0; i < runs.eager_losses.size(); ++i)
    if (i < 3)
      EXPECT_EQ(runs.kiln_losses[i], runs.eager_losses[i]) << "step " << i + 1;
    else
      EXPECT_NEAR(runs.kiln_losses[i], runs.eager_losses[i], 0.02 * std::abs(runs.eager_losses[i])) << "step " << i + 1;
  const std::vector<double> diff = printed(runs.compared, "relative_diff");
  ASSERT_EQ(diff.size(), 1u) << runs.compared;
  EXPECT_LE(diff[0], 0.03) << runs.compared;
}

// torchvision's resnet18 (3 classes), exported and trained on an image
// folder (PNG, so that kiln's decode is PIL's to the bit): its 20 steps'
// losses are an eager loop's over torchvision's ImageFolder in the same
// order, and the trained weights (every BatchNorm's statistics included)
// load back strictly and give kiln predict's outputs.
const char* kResnet = R"PY(
import sys, torch, torchvision
from torchvision import transforms
sys.path.insert(0, sys.argv[1])
import kiln_export
dir, what = sys.argv[2], sys.argv[3]
tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.25] * 3)])
if what == "export":
    from PIL import Image, ImageDraw
    g = torch.Generator().manual_seed(5)
    for split, n in (("train", 24), ("test", 4)):
        for c, shape in enumerate(("circle", "square", "bar")):
            import os
            os.makedirs(f"{dir}/images/{split}/{shape}", exist_ok=True)
            for i in range(n):
                noise = (torch.rand(32, 32, 3, generator=g) * 60).to(torch.uint8).numpy()
                img = Image.fromarray(noise, "RGB")
                d = ImageDraw.Draw(img)
                r = 6 + i % 5
                cx, cy = 10 + (i * 7) % 12, 10 + (i * 5) % 12
                box = [cx - r, cy - r, cx + r, cy + r]
                (d.ellipse if shape == "circle" else d.rectangle)(box if shape != "bar" else [cx - 2, 2, cx + 2, 30], fill=(200, 180, 60))
                img.save(f"{dir}/images/{split}/{shape}/{i:03d}.png")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3)
    torch.save(model.state_dict(), dir + "/init.pt")
    kiln_export.export(model, torch.zeros(2, 3, 32, 32), dir + "/model.pt2")
elif what == "eager":
    torch.set_num_threads(1)
    model = torchvision.models.resnet18(num_classes=3)
    model.load_state_dict(torch.load(dir + "/init.pt"))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torchvision.datasets.ImageFolder(dir + "/images/train", transform=tf)
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=False)
    steps = 0
    while steps < 20:
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            print("loss", repr(loss.item()))
            steps += 1
            if steps == 20:
                break
else:
    from safetensors.torch import load_file
    model = torchvision.models.resnet18(num_classes=3)
    model.load_state_dict(load_file(dir + "/weights.safetensors"), strict=True)
    model.eval()
    data = torchvision.datasets.ImageFolder(dir + "/images/test", transform=tf)
    x = torch.stack([data[i][0] for i in range(len(data))])
    with torch.no_grad():
        want = torch.softmax(model(x), dim=1)
    got = torch.load(dir + "/run/predictions.pt", weights_only=True)
    print("max_abs_diff", float((want - got).abs().max()))
)PY";

TEST(Exported, TorchvisionsResnet18TrainsAsEagerPyTorchOnAnImageFolder) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  auto run_python = [&](const char* what) { return run_script(dir, "resnet.py", kResnet, {what}); };
  const ProcessResult exported = run_python("export");
  if (exported.output.find("No module named 'torchvision'") != std::string::npos)
    GTEST_SKIP() << "no torchvision beside the checking Python's torch (./go test --torch wheel installs it)";
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  write_run_manifest(
      dir, {.name = "resnet",
            .run = "seed = 0\nthreads = 1\n",
            .model = exported_keys(dir, "model.pt2"),
            .data = "path = \"kiln_image_folder\"\ntrain = \"" + (dir / "images" / "train").string() + "\"\ntest = \"" +
                    (dir / "images" / "test").string() +
                    "\"\ntransforms = [{ name = \"normalize\", mean = [0.5, 0.5, 0.5], std = [0.25, 0.25, 0.25] }]\n",
            .trainer = trainer_keys(-1, 8, "max_steps = 20\n" + kInOrder),
            .optimizer = "name = \"sgd\"\nlr = 0.05\n",
            .extra = "\n[checkpoint]\n" + kCsvAndJsonl});
  const ProcessResult fit = kiln_fit(dir / "run.toml", {}, kTimeout);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const ProcessResult eager = run_python("eager");
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  expect_the_eager_losses(step_losses(dir / "run" / "metrics.jsonl"), eager);
  const auto last = dir / "run" / "checkpoints" / "last.ckpt";
  ASSERT_EQ(kiln({"export", last.string(), "-o", (dir / "weights.safetensors").string()}).exit_code, 0);
  const ProcessResult predicted = kiln({"predict", (dir / "run.toml").string(), "--ckpt", "last"});
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  const ProcessResult back = run_python("back");
  expect_the_same_outputs(back);
}

// The other losses: "mse" on a program that returns values, and "output"
// on a forward(x, y) that returns its own loss, each 20 steps an eager
// loop's to 1e-5; and what the exporter refuses (control flow on the data)
// and what kiln refuses (a dynamic dimension other than the batch).
const char* kRegress = R"PY(
import sys, torch
from torch import nn
sys.path.insert(0, sys.argv[1])
import kiln_export
dir, what = sys.argv[2], sys.argv[3]

class Net(nn.Module):
    def __init__(self, own_loss):
        super().__init__()
        self.own_loss = own_loss
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x, y=None):
        out = self.fc2(torch.tanh(self.fc1(x))).squeeze(1)
        return nn.functional.mse_loss(out, y) if self.own_loss else out

class Branchy(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x

g = torch.Generator().manual_seed(3)
x = torch.randn(160, 8, generator=g)
y = x[:, 0] * 2 - x[:, 1] + 0.1 * torch.randn(160, generator=g)
if what == "export":
    from safetensors.torch import save_file
    save_file({"x": x, "y": y}, dir + "/train.safetensors")
    torch.manual_seed(0)
    model = Net(False)
    torch.save(model.state_dict(), dir + "/init.pt")
    kiln_export.export(model, x[:4], dir + "/values.pt2")
    own = Net(True)
    own.load_state_dict(model.state_dict())
    kiln_export.export(own, x[:4], dir + "/loss.pt2", example_target=y[:4])
    try:
        kiln_export.export(Branchy(), x[:4], dir + "/branchy.pt2")
    except kiln_export.KilnExportError as e:
        print("refused:", e)
    # Two dynamic dimensions, written without the helper (which never does).
    from torch.export.pt2_archive._package import package_pt2
    b, f = torch.export.Dim("b", min=1), torch.export.Dim("f", min=2)
    ep = torch.export.export(nn.Sequential(nn.Flatten(0, -1)), (x[:4],), dynamic_shapes=({0: b, 1: f},))
    package_pt2(dir + "/wide.pt2", exported_programs={"train": ep, "eval": ep})
else:
    torch.set_num_threads(1)
    model = Net(False)
    model.load_state_dict(torch.load(dir + "/init.pt"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for i in range(0, 160, 16):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[i:i + 16]), y[i:i + 16])
            loss.backward()
            opt.step()
            print("loss", repr(loss.item()))
)PY";

TEST(Exported, RegressionAndAProgramsOwnLossTrainAsEagerPyTorch) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  const ProcessResult exported = run_script(dir, "regress.py", kRegress, {"export"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("refused: the forward has control flow that depends on the data"), std::string::npos)
      << exported.output;
  const ProcessResult eager = run_script(dir, "regress.py", kRegress, {"eager"});
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  for (const auto& [program, loss] : {std::pair{"values.pt2", "mse"}, std::pair{"loss.pt2", "output"}}) {
    SCOPED_TRACE(loss);
    write_run_manifest(dir, {.name = "regress",
                             .run = "seed = 0\nthreads = 1\n",
                             .model = exported_keys(dir, program, "loss = \"" + std::string(loss) + "\"\n"),
                             .data = "path = \"kiln_arrays\"\ntrain = \"" + (dir / "train.safetensors").string() +
                                     "\"\ntest = \"" + (dir / "train.safetensors").string() +
                                     "\"\ninput = \"x\"\ntarget = \"y\"\n",
                             .trainer = trainer_keys(2, 16, kInOrder),
                             .optimizer = "name = \"sgd\"\nlr = 0.05\n",
                             .extra = "\n[checkpoint]\n\n[logging]\nloggers = [\"jsonl\"]\n"});
    std::filesystem::remove_all(dir / "run");
    const ProcessResult fit = kiln_fit(dir / "run.toml", {}, kTimeout);
    ASSERT_EQ(fit.exit_code, 0) << fit.output;
    expect_the_eager_losses(step_losses(dir / "run" / "metrics.jsonl"), eager);
  }
  // The last is the program that returns only its loss: nothing to predict,
  // said in one line (never the loss's "probabilities").
  const ProcessResult predicted = kiln({"predict", (dir / "run.toml").string(), "--ckpt", "last"});
  EXPECT_EQ(predicted.exit_code, 2) << predicted.output;
  EXPECT_NE(predicted.output.find("returns the loss only"), std::string::npos) << predicted.output;
  // A dynamic dimension other than the batch: one line, exit 2, at create.
  write_file(dir / "wide.toml", "[run]\nname = \"wide\"\ndir = \"" + (dir / "wide").string() +
                                    "\"\n\n[model]\npath = \"kiln_exported\"\nprogram = \"" + (dir / "wide.pt2").string() +
                                    "\"\nloss = \"mse\"\n\n[data]\npath = \"kiln_arrays\"\ntrain = \"" +
                                    (dir / "train.safetensors").string() + "\"\ninput = \"x\"\ntarget = \"y\"\n");
  const ProcessResult wide = kiln_fit(dir / "wide.toml", {}, kTimeout);
  EXPECT_EQ(wide.exit_code, 2) << wide.output;
  EXPECT_NE(wide.output.find("dimension 1 of input 'input' is dynamic"), std::string::npos) << wide.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "wide")) << wide.output;
}

// Dropout's rate: a program whose "loss" is the share of a dropout's
// outputs that are zero (plus nothing times a parameter, for backward).
// Trained, it drops 30 % of 20 x 16 x 64 elements (within 6 standard
// deviations: 0.3 +- 0.02); in validation the evaluation program drops none.
const char* kDropoutRate = R"PY(
import sys, torch
from torch import nn
sys.path.insert(0, sys.argv[1])
import kiln_export
dir = sys.argv[2]

class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x, y):
        return (self.drop(x) == 0).float().mean() + 0 * self.w.sum() + 0 * y.sum()

from safetensors.torch import save_file
save_file({"x": torch.ones(400, 64), "y": torch.zeros(400)}, dir + "/ones.safetensors")
kiln_export.export(Dropped(), torch.ones(4, 64), dir + "/dropout.pt2", example_target=torch.zeros(4))
)PY";

TEST(Exported, DropoutDropsItsRateInTrainingAndNothingInValidation) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  const ProcessResult exported = run_script(dir, "dropout.py", kDropoutRate, {});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  write_run_manifest(dir, {.name = "dropout",
                           .run = "seed = 0\nthreads = 1\n",
                           .model = exported_keys(dir, "dropout.pt2", "loss = \"output\"\n"),
                           .data = "path = \"kiln_arrays\"\ntrain = \"" + (dir / "ones.safetensors").string() +
                                   "\"\nval_fraction = 0.2\ninput = \"x\"\ntarget = \"y\"\n",
                           .trainer = trainer_keys(-1, 16, "max_steps = 20\nlog_every_n_steps = 1\n"),
                           .optimizer = "name = \"sgd\"\nlr = 0.1\n",
                           .extra = kCsvAndJsonl});
  const ProcessResult fit = kiln_fit(dir / "run.toml", {}, kTimeout);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const std::vector<double> shares = step_losses(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(shares.size(), 20u);
  double mean = 0;
  for (const double s : shares) mean += s / static_cast<double>(shares.size());
  EXPECT_NEAR(mean, 0.3, 0.02) << fit.output;
  EXPECT_EQ(last_value(read_metrics(dir / "run" / "metrics.csv"), "val/loss"), 0.0) << fit.output;
}

// One line naming the archive and the problem, exit 2, no run directory.
// The training data with a ninth feature, for a program exported for 8.
const char* kWiderData = R"PY(
from safetensors.torch import save_file
x, y = data(160, 1)
save_file({"x": torch.cat([x, x[:, :1]], 1).contiguous(), "y": y}, sys.argv[2] + "/train.safetensors")
print("written")
)PY";

void expect_refused(const TempDir& dir, const std::string& expected) {
  const ProcessResult r = kiln_fit(manifest(dir), {}, kTimeout);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto at = r.output.find("kiln: error: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  EXPECT_NE(line.find(expected), std::string::npos) << line;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << r.output;
}

// Rewrites the archive's programs (models/*.json) as `edit` says: the
// damage a test does is the program's, not the zip's (whose checksums the
// reader checks).
const char* kEditArchive = R"PY(
import json, zipfile
source, target, what = sys.argv[2] + "/good.pt2", sys.argv[2] + "/model.pt2", sys.argv[3]
with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zout:
    for info in zin.infolist():
        data = zin.read(info.filename)
        if "/models/" in info.filename and info.filename.endswith(".json"):
            program = json.loads(data)
            if what == "unknown_op":
                for node in program["graph_module"]["graph"]["nodes"]:
                    if node["target"] == "torch.ops.aten.relu.default":
                        node["target"] = "torch.ops.aten.relx.default"
            elif what == "newer":
                program["torch_version"] = "9.0.0"
            data = json.dumps(program).encode()
        zout.writestr(info.filename, data)
)PY";

TEST(Exported, WhatCannotBeRunIsRefusedInOneLine) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  ASSERT_EQ(python(dir, kExport, {"0.0"}).exit_code, 0);
  const std::string good = read_file(dir / "model.pt2");
  write_file(dir / "good.pt2", good);
  // Not a .pt2 at all, and a truncated one.
  write_file(dir / "model.pt2", "not a zip archive");
  expect_refused(dir, "is not a .pt2 package or is truncated");
  write_file(dir / "model.pt2", good.substr(0, good.size() / 2));
  expect_refused(dir, "is not a .pt2 package or is truncated");
  // An operator this LibTorch does not have, named with its node.
  ASSERT_EQ(python(dir, kEditArchive, {"unknown_op"}).exit_code, 0);
  expect_refused(dir, "node 'relu' (torch.ops.aten.relx.default) calls aten::relx");
  // A program written by a newer torch.
  ASSERT_EQ(python(dir, kEditArchive, {"newer"}).exit_code, 0);
  expect_refused(dir, "written by torch 9.0.0, newer than this kiln's LibTorch");
  // A program whose input is not the data module's batch, found in a sample
  // batch before anything runs: both shapes.
  write_file(dir / "model.pt2", good);
  ASSERT_EQ(python(dir, kWiderData, {}).exit_code, 0);
  expect_refused(dir, "takes input 'x' of shape [batch, 8], the data module's batch has [2, 9]");
}

// The README's "From Python" commands as typed (examples/from_python):
// export FashionNet with python/kiln_export.py, then `kiln fit fashion.toml`
// beside it (two steps here; the manifest's two epochs are the README's).
TEST(Exported, TheFromPythonExampleRunsAsTheReadmeSays) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  const auto example = source_dir() / "examples" / "from_python";
  for (const char* file : {"model.py", "fashion.toml"}) std::filesystem::copy_file(example / file, dir / file);
  const ProcessResult exported =
      run_process({check_python().string(), (source_dir() / "python" / "kiln_export.py").string(), "model.py",
                   "FashionNet", "--shape", "784", "-o", "model.pt2"},
                  {.cwd = dir.path(), .timeout = kTimeout});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const ProcessResult fit =
      kiln({"fit", "fashion.toml", "--set", "trainer.max_steps=2", "--set", "trainer.limit_val_batches=1", "--set",
            "trainer.limit_test_batches=1", "--set", "trainer.progress=none"},
           {.cwd = dir.path(), .timeout = kTimeout});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  EXPECT_GE(last_value(read_metrics(dir / "runs" / "fashion-from-python" / "metrics.csv"), "test/acc"), 0.0)
      << fit.output;
}

// With distributed.shard = "parameters" no rank holds an exported model
// whole at start-up: kiln_exported maps the archive's weights instead of
// reading them (the "eval" program's copies, dropped after set-up, cost
// nothing), and the host broadcasts rank 0's weights a bucket at a time as
// it shards them, so a rank reads its own part of each and holds one bucket
// beyond it. 32 layers of 1024 x 1024 (128 MiB of float32), 4 MB buckets,
// 3 ranks: a rank's peak resident memory grows by less than 3/4 of the
// model from main() to the end of the sharding (its third is 43 MiB); a
// commit makes the weights whole on rank 0 alone.
// Reading the weights, as kiln_exported did, it grew by more than twice the
// model (the train and eval programs' copies); broadcasting them whole, by
// 1 1/3 times.
TEST(Exported, ShardedParametersNeverHoldTheWholeModelAtStartUp) {
  KILN_REQUIRE_EXPORTED_PLUGIN();
  TempDir dir;
  const ProcessResult exported = run_script(dir, "deep.py", R"PY(
import sys, torch
from torch import nn
sys.path.insert(0, sys.argv[1])
import kiln_export
from safetensors.torch import save_file
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(32)], nn.Linear(1024, 4))
g = torch.Generator().manual_seed(1)
x = torch.randn(32, 1024, generator=g)
save_file({"x": x, "y": torch.randint(0, 4, (32,), generator=g)}, sys.argv[2] + "/train.safetensors")
kiln_export.export(model, x[:4], sys.argv[2] + "/model.pt2")
print("values", sum(p.numel() for p in model.parameters()))
)PY", {});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::vector<double> values = printed(exported.output, "values");
  ASSERT_EQ(values.size(), 1u) << exported.output;
  const double model_mb = values[0] * 4 / 1048576;
  const std::filesystem::path m = write_run_manifest(
      dir, {.name = "deep",
            .run = "seed = 0\nthreads = 1\n",
            .model = exported_keys(dir, "model.pt2"),
            .data = "path = \"kiln_arrays\"\ntrain = \"" + (dir / "train.safetensors").string() +
                    "\"\ninput = \"x\"\ntarget = \"y\"\n",
            .trainer = trainer_keys(1, 8, kInOrder + "limit_train_batches = 1\n"),
            .optimizer = "name = \"sgd\"\nlr = 0.1\n",
            .extra = "\n[distributed]\nshard = \"parameters\"\nbucket_mb = 4\n[checkpoint]\n"});
  const ProcessResult fit = kiln({"fit", m.string(), "-n", "3", "--log-level", "debug"}, {.timeout = kTimeout});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  // "main() reached ...; peak resident memory N MB" (every process, before
  // any rank is known) and "[rank r] ... parameters sharded at ...; peak
  // resident memory N MB".
  double before = 0;
  std::map<std::string, double> sharded, committed, allocated, gathered;  // by "[rank r]"
  std::istringstream lines(fit.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t open = line.find("[rank "), close = line.find(']', open);
    const std::string rank = open == std::string::npos ? "" : line.substr(open, close - open + 1);
    if (const size_t at = line.find("peak resident memory "); at != std::string::npos) {
      const double mb = std::stod(line.substr(at + 21));
      if (line.find("main() reached") != std::string::npos) before = std::max(before, mb);
      if (line.find("parameters sharded") != std::string::npos) sharded[rank] = mb;
    }
    if (const size_t at = line.find(" for a commit)"); at != std::string::npos) {
      committed[rank] = std::stod(line.substr(line.rfind('(', at) + 1));
      allocated[rank] = std::stod(line.substr(at + 15));
      gathered[rank] = std::stod(line.substr(line.find("parameters: ") + 12));
    }
  }
  ASSERT_GT(before, 0) << fit.output;
  ASSERT_EQ(sharded.size(), 3u) << fit.output;
  for (const auto& [rank, peak] : sharded)
    EXPECT_LT(peak - before, 0.75 * model_mb) << rank << "'s peak grew from " << before << " to " << peak
                                              << " MB over a model of " << model_mb << " MB";
  // The fit's checkpoint: rank 0 alone writes the param/ sections, so only
  // it holds the weights whole; the others take part in each bucket's
  // gather and free it at once (every rank held them whole before).
  ASSERT_EQ(committed.size(), 3u) << fit.output;
  EXPECT_EQ(committed.at("[rank 0]"), values[0] * 4) << fit.output;
  for (const char* rank : {"[rank 1]", "[rank 2]"}) {
    EXPECT_LE(committed.at(rank), 1024 * 1024 * 4 + 1024 * 4) << rank << ": " << fit.output;
    // Every layer's weight is the size of the others: after the first few,
    // each gather (and the commit's) takes the memory of a bucket freed
    // before it, not the allocator's (which, churned, held memory apart on
    // each rank).
    EXPECT_GE(gathered.at(rank), 100) << rank << ": " << fit.output;
    EXPECT_LE(allocated.at(rank), gathered.at(rank) / 4) << rank << " of " << gathered.at(rank) << " gathers: "
                                                          << fit.output;
  }
}

}  // namespace
}  // namespace kiln::test
