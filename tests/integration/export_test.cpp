// `kiln export`: the weights of a checkpoint, read back by the readers
// people use (safetensors.torch.load_file, torch.load) into an equivalent
// torch.nn module, predict what `kiln predict` predicted from the same
// checkpoint, to 1e-5.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(300);

// Writes a small Fashion-MNIST look-alike (the four gzipped IDX files, random
// images and labels) into sys.argv[1].
const char* const kMakeData = R"(
import gzip, os, struct, sys
import numpy as np
root = sys.argv[1]
rng = np.random.default_rng(7)
def write(name, magic, dims, data):
    with gzip.open(os.path.join(root, name), "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + data.tobytes())
for prefix, n in (("train", 256), ("t10k", 96)):
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    write(prefix + "-images-idx3-ubyte.gz", 0x803, (n, 28, 28), images)
    write(prefix + "-labels-idx1-ubyte.gz", 0x801, (n,), labels)
)";

// Loads the exported weights (argv[2]: safetensors or pt file) into the MLP
// as torch.nn writes it, runs the predict split (the t10k file in argv[1])
// and compares with kiln's predictions.pt (argv[3]).
const char* const kCheck = R"(
import gzip, sys
import numpy as np
import torch
root, weights_file, predictions_file, fmt = sys.argv[1:5]
if fmt == "safetensors":
    from safetensors import safe_open
    from safetensors.torch import load_file
    state = load_file(weights_file)
    with safe_open(weights_file, framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and int(meta["global_step"]) == 8, meta
else:
    # What torch.load does by default since PyTorch 2.6 (and 1.13 can be
    # asked for): only plain containers of tensors, no other globals.
    state = torch.load(weights_file, weights_only=True)
    assert isinstance(state, dict), type(state)
class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 16)
        self.fc2 = torch.nn.Linear(16, 10)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
model = Mlp()
model.load_state_dict(state, strict=True)
with gzip.open(root + "/t10k-images-idx3-ubyte.gz", "rb") as f:
    images = np.frombuffer(f.read()[16:], dtype=np.uint8).reshape(-1, 784)
x = torch.from_numpy(images.astype(np.float32)) / 255.0
with torch.no_grad():
    ours = torch.softmax(model(x), dim=1)
theirs = torch.load(predictions_file, weights_only=True)
assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
diff = (ours - theirs).abs().max().item()
assert diff <= 1e-5, diff
print("OK", sorted(state), diff)
)";

TEST(Export, SafetensorsAndPtLoadIntoTorchNnAndPredictLikeKiln) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  write_file(dir / "make_data.py", kMakeData);
  write_file(dir / "check.py", kCheck);
  std::filesystem::create_directories(dir / "data");
  const ProcessResult data = run_process({check_python().string(), (dir / "make_data.py").string(), (dir / "data").string()});
  ASSERT_EQ(data.exit_code, 0) << data.output;

  write_run_manifest(dir, {.name = "export",
                           .run = "seed = 1\nthreads = 1\n",
                           .model = mlp_keys(784, "[16]", 10),
                           .data = "path = \"kiln_fashion_mnist\"\nroot = \"" + (dir / "data").string() + "\"\nval_size = 0\n",
                           .trainer = trainer_keys(1, 32),
                           .optimizer = "name = \"sgd\"\nlr = 0.1\n",
                           .extra = "\n[checkpoint]\n"});
  const ProcessResult fit = kiln({"fit", (dir / "run.toml").string()}, {.timeout = kTimeout});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const auto ckpt = dir / "run" / "checkpoints" / "last.ckpt";
  const ProcessResult predict = kiln({"predict", (dir / "run.toml").string(), "--ckpt", ckpt.string()}, {.timeout = kTimeout});
  ASSERT_EQ(predict.exit_code, 0) << predict.output;

  const ProcessResult st = kiln({"export", ckpt.string()}, {.timeout = kTimeout});
  ASSERT_EQ(st.exit_code, 0) << st.output;
  const auto st_file = dir / "run" / "checkpoints" / "last.safetensors";  // beside the checkpoint by default
  EXPECT_NE(st.output.find("exported 4 tensors"), std::string::npos) << st.output;
  const auto pt_file = dir / "weights.pt";
  const ProcessResult pt = kiln({"export", ckpt.string(), "--format", "pt", "-o", pt_file.string()}, {.timeout = kTimeout});
  ASSERT_EQ(pt.exit_code, 0) << pt.output;

  for (const auto& [file, format] : {std::make_pair(st_file, "safetensors"), std::make_pair(pt_file, "pt")}) {
    const ProcessResult check = run_process({check_python().string(), (dir / "check.py").string(), (dir / "data").string(),
                                             file.string(), (dir / "run" / "predictions.pt").string(), format},
                                            {.timeout = kTimeout});
    EXPECT_EQ(check.exit_code, 0) << format << ": " << check.output;
    EXPECT_NE(check.output.find("OK ['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight']"), std::string::npos)
        << check.output;
  }

  // An existing export is kept unless --force says otherwise.
  const std::string first = read_file(st_file);
  const ProcessResult again = kiln({"export", ckpt.string()}, {.timeout = kTimeout});
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_EQ(read_file(st_file), first);
  EXPECT_EQ(kiln({"export", ckpt.string(), "--force"}, {.timeout = kTimeout}).exit_code, 0);
}

}  // namespace
}  // namespace kiln::test
