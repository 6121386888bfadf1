// Loading a checkpoint, in two modes chosen by the input's first bytes.
//
// Raw (the input starts with "KILNCKPT"): the input is the file. check()
// names a problem or none, read() gives a validated file or throws
// CheckpointError, and the two agree; so does the directory listing's
// read_checkpoint_head for a file that reads. A file that reads (the seeds, mostly:
// mutations rarely keep the checksum) goes on as below.
//
// Sections (anything else): the input is a list of sections, written with
// CheckpointWriter so that the file is valid and its checksum right: what is
// fuzzed is what kiln does with valid files of crafted content. read_meta()
// gives metadata or CheckpointError; the SDK's plugin-state tensors
// (kiln::detail::tensor_from_bytes, behind StateReader::read_tensor) a
// tensor or std::invalid_argument; the parts a run registers, restored into a small model
// with an Adam or SGD optimizer restores or throws (CheckpointError; other
// exceptions are tolerated and logged once each, see note()).
//
// In both modes nothing allocates more than the file's size justifies
// (run.sh sets -malloc_limit_mb far below what a lying header could ask for)
// and nothing in the file is executed: no pickle, no TorchScript.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/checkpoint_parts.hpp"
#include "ckpt/tensor_sections.hpp"
#include "metrics/metrics_checkpoint.hpp"
#include "plugin/plugin_states.hpp"
#include "optim/optimizer_checkpoint.hpp"
#include "fuzz_file.hpp"
#include "kiln/detail/tensor_bytes.hpp"

namespace {

// Section names the restore path looks for, so that mutations of a selector
// byte move between meaningful sections. A selector past the table takes a
// name from the input.
const char* const kNames[] = {
    "meta",           "manifest",        "param/weight",          "param/bias",
    "buffer/running", "optim/0/step",    "optim/0/exp_avg",       "optim/0/exp_avg_sq",
    "optim/0/max_exp_avg_sq", "optim/0/sgd", "optim/0/momentum_buffer", "optim/1/step",
    "optim/1/exp_avg", "optim/1/exp_avg_sq", "optim/1/sgd",          "optim/1/momentum_buffer",
    "rng/cpu",        "plugin/p/state",  "plugin/p/tensor",       "metrics/latest",
    "metrics/pending", "metrics/csv",
};
constexpr size_t kNameCount = sizeof kNames / sizeof kNames[0];

struct Reader {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  bool done() const { return at >= size; }
  uint8_t byte() { return at < size ? data[at++] : 0; }
  std::string_view bytes(size_t n) {
    n = std::min(n, size - std::min(at, size));
    const std::string_view out(reinterpret_cast<const char*>(data) + at, n);
    at += n;
    return out;
  }
};

// The models restored into: the shape of the test recorder plugin's (as in
// the raw seeds), with or without a buffer, and optimizers that have state
// to replace.
struct Model {
  kiln::NamedTensors params{{"weight", at::zeros({2, 4})}, {"bias", at::zeros({2})}};
  kiln::NamedTensors buffers;
  std::vector<at::Tensor> trainable;
  torch::optim::Adam adam;
  torch::optim::SGD sgd;
  explicit Model(bool with_buffer)
      : trainable{params[0].second.requires_grad_(), params[1].second.requires_grad_()},
        adam(trainable, torch::optim::AdamOptions(1e-3)),
        sgd(trainable, torch::optim::SGDOptions(1e-2).momentum(0.9)) {
    if (with_buffer) buffers.emplace_back("running", at::zeros({2}));
  }
};

// Non-CheckpointError exceptions out of a restore: tolerated (they
// are errors, not crashes), reported once each so a run's log lists them.
void note(const char* what) {
  static std::set<std::string> seen;
  std::string key(what, std::min<size_t>(std::strlen(what), 60));
  if (seen.size() < 32 && seen.insert(key).second) std::fprintf(stderr, "restore threw a non-CheckpointError: %s\n", what);
}

// What kiln does with a valid file: metadata (only CheckpointError may come
// out), plugin-state tensors (a tensor or std::invalid_argument), restore.
// flags: bit 0 picks SGD over Adam, bit 1 the model with a buffer.
void use(const kiln::CheckpointFile& checkpoint, uint8_t flags) {
  try {
    if (checkpoint.has("meta")) (void)kiln::read_meta(checkpoint);
  } catch (const kiln::CheckpointError&) {
  }
  for (const auto& name : checkpoint.names()) {
    if (name.rfind("plugin/", 0) != 0) continue;
    try {
      const at::Tensor t = kiln::detail::tensor_from_bytes(checkpoint.section(name));
      if (t.numel() <= (1 << 16)) (void)t.clone();
    } catch (const std::invalid_argument&) {
    }
  }

  static Model plain(false), buffered(true);
  Model& model = (flags & 2) ? buffered : plain;
  // The parts a run registers (train/run/run_checkpoints.cpp), in its order.
  kiln::TrainPosition position;
  kiln::SavedBy saved_by;
  const std::string monitor, manifest_text;
  std::optional<double> monitored;
  kiln::PluginStates plugin_states;
  kiln::MetricsSections metrics;
  const std::string groups;
  kiln::MetaPart meta({position, saved_by, monitor, monitored, manifest_text});
  kiln::ModelTensorsPart params("param/", "parameter", model.params), buffers("buffer/", "buffer", model.buffers);
  kiln::RngPart rng{c10::Device(c10::kCPU)};
  kiln::PluginStatesPart plugins(plugin_states);
  kiln::MetricsPart metrics_part(metrics, saved_by);
  kiln::OptimizerPart optimizer((flags & 1) ? static_cast<torch::optim::Optimizer&>(model.sgd) : model.adam,
                                &model.trainable, groups);
  kiln::CheckpointParts parts;
  parts.add("meta", meta, kiln::load_priority::position);
  parts.add("param", params, kiln::load_priority::model);
  parts.add("buffer", buffers, kiln::load_priority::model);
  parts.add("rng", rng, kiln::load_priority::model);
  parts.add("plugin", plugins, kiln::load_priority::run);
  parts.add("metrics", metrics_part, kiln::load_priority::run);
  parts.add("optim", optimizer, kiln::load_priority::model);
  try {
    parts.restore(checkpoint);
  } catch (const kiln::CheckpointError&) {
  } catch (const std::exception& e) {
    note(e.what());
  }
}

// The directory listing's read of a file (read_checkpoint_head: header,
// "meta", trailer; no checksum) agrees with the full read: a file read()
// accepts is listed, with the same metadata, whenever it has a "meta"
// section of plausible size. (The head may accept more: it does not verify
// the checksum.)
void agrees_with_head(const std::string& file, const kiln::CheckpointFile& checkpoint) {
  if (!checkpoint.has("meta") || checkpoint.section("meta").size() > 64 * 1024) return;
  try {
    if (kiln::read_checkpoint_head(file).meta != checkpoint.section("meta")) __builtin_trap();
  } catch (const kiln::CheckpointError&) {
    __builtin_trap();  // the listing would skip a valid checkpoint
  }
}

void raw(const uint8_t* data, size_t size) {
  const std::string file = kiln_fuzz::input_file(".ckpt", data, size);
  const auto problem = kiln::CheckpointFile::check(file);
  std::optional<kiln::CheckpointFile> checkpoint;
  try {
    checkpoint.emplace(kiln::CheckpointFile::read(file));
  } catch (const kiln::CheckpointError&) {
    if (!problem) __builtin_trap();  // check() accepted what read() refuses
    return;
  }
  if (problem) __builtin_trap();  // check() refused what read() accepts
  agrees_with_head(file, *checkpoint);
  for (const auto& name : checkpoint->names()) {
    const std::string_view bytes = checkpoint->section(name);
    volatile uint8_t sink = 0;
    for (char c : bytes) sink ^= static_cast<uint8_t>(c);
    (void)sink;
  }
  use(*checkpoint, 0);
}

// Input: a flags byte, then sections, each: a selector byte (an index into
// kNames, or past it: a length byte and the name), a little-endian u16
// length, the data.
void sections(const uint8_t* data, size_t size) {
  Reader in{data, size};
  const uint8_t flags = in.byte();
  static const std::string file = "/dev/shm/kiln-fuzz-" + std::to_string(::getpid()) + "-sections.ckpt";
  {
    kiln::CheckpointWriter writer(file);
    while (!in.done()) {
      const uint8_t selector = in.byte();
      const std::string name = selector < kNameCount ? kNames[selector] : std::string(in.bytes(in.byte()));
      const uint16_t length = static_cast<uint16_t>(in.byte() | (in.byte() << 8));
      try {
        writer.add(name, in.bytes(length));
      } catch (const std::invalid_argument&) {  // empty or duplicate name
      }
    }
    writer.commit();
  }
  const kiln::CheckpointFile checkpoint = kiln::CheckpointFile::read(file);
  agrees_with_head(file, checkpoint);
  use(checkpoint, flags);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 8 && std::memcmp(data, "KILNCKPT", 8) == 0)
    raw(data, size);
  else
    sections(data, size);
  return 0;
}
