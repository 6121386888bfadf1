#include "ckpt/weights_export.hpp"

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/safetensors_format.hpp"
#include "ckpt/tensor_sections.hpp"
#include "util/durable_file.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

namespace fs = std::filesystem;

const char* extension(ExportFormat format) { return format == ExportFormat::pt ? ".pt" : ".safetensors"; }

// Parameters, then buffers, each in checkpoint order (the model's order);
// with `averaged`, each tensor the run averaged ([averaging]) is its average.
std::vector<std::pair<std::string, at::Tensor>> weights(const CheckpointFile& file, bool averaged) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const char* prefix : {"param/", "buffer/"}) {
    const std::string p = prefix;
    for (const auto& name : file.names()) {
      if (name.rfind(p, 0) != 0) continue;
      const std::string average = "average/" + name;
      out.emplace_back(name.substr(p.size()),
                       read_tensor_section(file, averaged && file.has(average) ? average : name));
    }
  }
  if (out.empty()) throw CheckpointError(file.path().string() + ": the checkpoint holds no model weights");
  return out;
}

std::string safetensors_bytes(const CheckpointFile& file, const std::vector<std::pair<std::string, at::Tensor>>& w,
                              bool averaged) {
  const CheckpointMeta meta = read_meta(file);
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : w) {
    const char* bytes = static_cast<const char*>(t.data_ptr());
    entries.push_back({name, c10::toString(t.scalar_type()), t.sizes().vec(),
                       std::string_view(bytes, t.numel() * t.element_size())});
    if (safetensors_dtype(entries.back().dtype).empty())
      throw InputError(file.path().string() + ": '" + name + "' is " + entries.back().dtype +
                       ", which safetensors cannot hold (export with --format pt)");
  }
  const std::vector<std::pair<std::string, std::string>> metadata{
      {"format", "pt"},  // what safetensors.torch writes: the tensors are torch's
      {"kiln_version", meta.kiln_version},
      {"exported_by", std::string("kiln ") + KILN_VERSION},
      {"checkpoint", file.path().filename().string()},
      {"epoch", std::to_string(meta.position.epoch)},
      {"global_step", std::to_string(meta.position.global_step)},
      {"weights", averaged ? "averaged" : "trained"},
  };
  return safetensors_file(entries, metadata);
}

// torch.save's zip archive of a plain dict. LibTorch's pickle_save tags a
// typed dict with torch.jit._pickle.restore_type_tag, a global that
// torch.load refuses by default since PyTorch 2.6 (weights_only=True); an
// untagged dict of tensors is what torch.save writes and every torch.load
// takes.
std::string pt_bytes(const std::vector<std::pair<std::string, at::Tensor>>& w) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : w) dict.insert(name, t);
  std::string pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.append(data, size); }, nullptr, nullptr,
                              nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace

ExportResult export_weights(const ExportRequest& request) {
  if (auto problem = CheckpointFile::check(request.checkpoint)) throw InputError(*problem);
  const CheckpointFile file = CheckpointFile::read(request.checkpoint);

  fs::path output = request.output.value_or(fs::path(request.checkpoint).replace_extension(extension(request.format)));
  std::error_code ec;
  const fs::path dir = output.parent_path().empty() ? fs::path(".") : output.parent_path();
  if (!fs::is_directory(dir, ec))
    throw InputError(output.string() + ": the directory " + dir.string() + " does not exist (create it, or choose "
                                                                           "another file with -o)");
  if (fs::is_directory(output, ec))
    throw InputError(output.string() + " is a directory: name the file to write with -o, e.g. -o " +
                     (output / ("model" + std::string(extension(request.format)))).string());
  if (fs::equivalent(output, request.checkpoint, ec))
    throw InputError(output.string() + " is the checkpoint itself: choose another file with -o");
  if (fs::exists(output, ec) && !request.overwrite)
    throw InputError(output.string() + " exists: pass --force to replace it, or -o to write another file");

  // An average with no update folded in yet (SWA before its first epoch) is
  // not one: the trained weights are written then.
  const bool averaged =
      !request.trained_weights && file.has("average/count") && file.section("average/count") != "0";
  const auto w = weights(file, averaged);
  const std::string bytes = request.format == ExportFormat::pt ? pt_bytes(w) : safetensors_bytes(file, w, averaged);
  write_file_durably(output, bytes);
  return ExportResult{output, w.size(), bytes.size(), averaged};
}

}  // namespace kiln
