#include "pt2_archive.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <optional>
#include <cstring>
#include <tuple>
#include <variant>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/utils/generated_serialization_types.h>

#include "mapped_weights.hpp"
#include "scalar_types.hpp"

namespace kiln_exported {

namespace ser = torch::_export;

namespace {

// "2.15.0+cu130" -> {2, 15}; {-1, -1} when it does not read.
std::pair<int, int> major_minor(const std::string& version) {
  int major = -1, minor = -1;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2) return {-1, -1};
  return {major, minor};
}

// Bytes in memory as the zip reader reads them. LibTorch's own
// MemoryReadAdapter calls memcpy with the null buffer miniz passes for an
// empty record (undefined behaviour: the fuzzer's pt2 target found it).
class BytesReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReadAdapter(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/ = "") const override {
    if (pos >= bytes_.size() || n == 0) return 0;
    n = std::min<size_t>(n, bytes_.size() - static_cast<size_t>(pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

class Archive {
 public:
  // `file`: the archive's file, whose stored records can be mapped; none
  // for bytes in memory.
  Archive(std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader, std::string name,
          std::optional<MappedFile> file = std::nullopt)
      : reader_(std::move(reader)), name_(std::move(name)), file_(std::move(file)) {}

  // The record as a contiguous tensor of `sizes` mapping the file
  // (mapped_weights.hpp), when it holds exactly those values and is stored
  // uncompressed; nullopt otherwise (then it is read).
  std::optional<at::Tensor> mapped(const std::string& record, const std::vector<int64_t>& sizes, at::ScalarType dtype) {
    if (!file_) return std::nullopt;
    size_t values = 1;
    for (const int64_t s : sizes)
      if (s < 0 || __builtin_mul_overflow(values, static_cast<size_t>(s), &values)) return std::nullopt;
    size_t needed = 0;
    if (__builtin_mul_overflow(values, c10::elementSize(dtype), &needed)) return std::nullopt;
    return guarded("its record '" + record + "'", [&]() -> std::optional<at::Tensor> {
      if (reader_->getRecordSize(record) != needed) return std::nullopt;
      return file_->map(reader_->getRecordHeaderOffset(record), reader_->getRecordOffset(record), needed, sizes, dtype);
    });
  }

  // Every call into LibTorch's reader: its errors (a damaged zip, a name
  // outside the archive's folder) become this archive's one line.
  bool has(const std::string& record) {
    return guarded("its record '" + record + "'", [&] { return reader_->hasRecord(record); });
  }

  std::string text(const std::string& record) {
    auto [data, size] = get(record);
    return std::string(static_cast<const char*>(data.get()), size);
  }

  std::tuple<at::DataPtr, size_t> get(const std::string& record) {
    return guarded("its record '" + record + "'", [&] { return reader_->getRecord(record); });
  }

  std::vector<std::string> records() {
    return guarded("its list of records", [&] { return reader_->getAllRecords(); });
  }
  const std::string& name() const { return name_; }

  static std::string one_line(const c10::Error& e) {
    std::string m = e.what_without_backtrace();
    if (const size_t nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
    return m;
  }

 private:
  template <class F>
  auto guarded(const std::string& what, F&& read) -> decltype(read()) {
    try {
      return read();
    } catch (const c10::Error& e) {
      throw Pt2Error("'" + name_ + "': " + what + " does not read (" + one_line(e) + "); the archive is damaged");
    }
  }

  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  std::string name_;
  std::optional<MappedFile> file_;
};

// Sizes and strides of a tensor laid out row-major, from element 0.
bool row_major(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t offset) {
  if (offset != 0 || strides.size() != sizes.size()) return false;
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

template <class T>
T parse_json(Archive& archive, const std::string& record, const char* what) {
  const std::string text = archive.text(record);
  try {
    return nlohmann::json::parse(text).get<T>();
  } catch (const std::exception& e) {
    throw Pt2Error("'" + archive.name() + "': " + record + " is not " + what + " (" + e.what() + ")");
  }
}

// Every element a tensor of these sizes and strides reaches lies inside
// `bytes` bytes of storage.
bool fits(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t offset, size_t item,
          size_t bytes) {
  int64_t last = offset;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0 || strides[d] < 0) return false;
    if (sizes[d] == 0) return true;
    last += (sizes[d] - 1) * strides[d];
  }
  return offset >= 0 && static_cast<size_t>(last + 1) * item <= bytes;
}

std::vector<int64_t> concrete(const std::vector<ser::SymInt>& values, const std::string& what) {
  std::vector<int64_t> out;
  for (const auto& v : values) {
    if (v.tag() != ser::SymInt::Tag::AS_INT) throw Pt2Error(what + " has a symbolic size");
    out.push_back(v.get_as_int());
  }
  return out;
}

// `kind`: "weights" or "constants", the folder and the config's name.
std::map<std::string, ProgramWeight> read_tensors(Archive& archive, const std::string& program, const std::string& kind) {
  std::map<std::string, ProgramWeight> out;
  const std::string config_record = "data/" + kind + "/" + program + "_" + kind + "_config.json";
  if (!archive.has(config_record)) return out;  // a program without parameters or buffers
  const auto config = parse_json<ser::PayloadConfig>(archive, config_record, "a weights description");
  for (const auto& [name, meta] : config.get_config()) {
    const std::string what = "'" + archive.name() + "': " + (kind == "weights" ? "weight" : "constant") + " '" + name + "'";
    if (meta.get_use_pickle())
      throw Pt2Error(what + " is pickled (a tensor subclass?); kiln reads plain tensors only");
    if (!meta.get_tensor_meta()) throw Pt2Error(what + " has no tensor description");
    const ser::TensorMeta& t = *meta.get_tensor_meta();
    const auto dtype = to_scalar_type(t.get_dtype());
    if (!dtype) throw Pt2Error(what + " has a dtype kiln does not read");
    const auto sizes = concrete(t.get_sizes(), what);
    const auto strides = concrete(t.get_strides(), what);
    if (strides.size() != sizes.size()) throw Pt2Error(what + " has " + std::to_string(strides.size()) +
                                                       " strides for " + std::to_string(sizes.size()) + " sizes");
    const int64_t offset = t.get_storage_offset().tag() == ser::SymInt::Tag::AS_INT
                               ? t.get_storage_offset().get_as_int()
                               : -1;
    const std::string record = "data/" + kind + "/" + meta.get_path_name();
    // A weight maps the file (read only where a page is used); a constant,
    // made while tracing, is small and read.
    if (kind == "weights" && row_major(sizes, strides, offset))
      if (std::optional<at::Tensor> mapped = archive.mapped(record, sizes, *dtype)) {
        out[name] = ProgramWeight{*mapped, meta.get_is_param(), t.get_requires_grad()};
        continue;
      }
    auto [data, bytes] = archive.get(record);
    const size_t item = c10::elementSize(*dtype);
    if (!fits(sizes, strides, offset, item, bytes))
      throw Pt2Error(what + " needs more bytes than its record '" + meta.get_path_name() + "' holds (" +
                     std::to_string(bytes) + "); the archive is damaged");
    // A copy of its own: the record's buffer goes with the reader.
    const at::Tensor view =
        at::from_blob(data.get(), {static_cast<int64_t>(bytes / item)}, at::TensorOptions().dtype(*dtype))
            .as_strided(sizes, strides, offset);
    out[name] = ProgramWeight{view.contiguous().clone(), meta.get_is_param(), t.get_requires_grad()};
  }
  return out;
}

std::map<std::string, Pt2Program> read_programs(Archive& archive, const std::string& torch_version);

// extra/kiln.json, as python/kiln_export.py writes it:
// {"kiln_export": 1, "checkpointing": false,
//  "programs": {"train": {"inputs": ["input_ids", ...], "outputs": ["loss", "logits"]}, ...}}
void read_interface(Archive& archive, std::map<std::string, Pt2Program>& programs) {
  const std::string record = "extra/kiln.json";
  if (!archive.has(record)) return;
  const std::string text = archive.text(record);
  const auto bad = [&](const std::string& why) {
    return Pt2Error("'" + archive.name() + "': " + record + " " + why + "; export the model again with python/kiln_export.py");
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw bad(std::string("is not JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("programs") || !j["programs"].is_object()) throw bad("has no \"programs\" object");
  const bool checkpointing = j.value("checkpointing", false);
  const auto names = [&](const nlohmann::json& list, const std::string& what) {
    std::vector<std::string> out;
    if (!list.is_array()) throw bad(what + " is not a list of names");
    for (const auto& item : list) {
      if (!item.is_string() || item.get<std::string>().empty()) throw bad(what + " holds something other than a name");
      out.push_back(item.get<std::string>());
    }
    return out;
  };
  for (auto& [name, program] : programs) {
    program.had_checkpointing = checkpointing;
    if (!j["programs"].contains(name)) continue;
    const nlohmann::json& entry = j["programs"][name];
    if (!entry.is_object()) throw bad("program '" + name + "' is not an object");
    program.input_names = names(entry.value("inputs", nlohmann::json::array()), "program '" + name + "' inputs");
    program.output_names = names(entry.value("outputs", nlohmann::json::array()), "program '" + name + "' outputs");
  }
}

// As GraphProgram's binding: a union whose tag its JSON did not set.
std::map<std::string, Pt2Program> read(Archive& archive, const std::string& torch_version) {
  try {
    return read_programs(archive, torch_version);
  } catch (const std::bad_variant_access&) {
    throw Pt2Error("'" + archive.name() +
                   "': a weight or program holds a value of a kind this LibTorch's export schema does not know "
                   "(written by a newer torch, or damaged)");
  }
}

std::map<std::string, Pt2Program> read_programs(Archive& archive, const std::string& torch_version) {
  if (!archive.has("archive_format") || archive.text("archive_format") != "pt2")
    throw Pt2Error("'" + archive.name() + "' is not a .pt2 package (no archive_format 'pt2' record); write it with "
                   "python/kiln_export.py or torch.export.pt2_archive's package_pt2");
  std::map<std::string, Pt2Program> out;
  for (const std::string& record : archive.records()) {
    constexpr const char* prefix = "models/";
    constexpr const char* suffix = ".json";
    if (record.rfind(prefix, 0) != 0 || record.size() <= 12 ||
        record.compare(record.size() - 5, 5, suffix) != 0)
      continue;
    const std::string name = record.substr(7, record.size() - 12);
    auto program = std::make_shared<ser::ExportedProgram>(
        parse_json<ser::ExportedProgram>(archive, record, "an exported program in the schema this LibTorch reads"));
    const auto written_by = major_minor(program->get_torch_version());
    const auto host = major_minor(torch_version);
    if (written_by > host)
      throw Pt2Error("'" + archive.name() + "': program '" + name + "' was written by torch " +
                     program->get_torch_version() + ", newer than this kiln's LibTorch " + torch_version +
                     "; export it with torch " + std::to_string(host.first) + "." + std::to_string(host.second) +
                     " or build kiln against a newer LibTorch");
    Pt2Program p{std::move(program), read_tensors(archive, name, "weights"), {}, {}, {}, false};
    for (auto& [constant, t] : read_tensors(archive, name, "constants")) p.constants[constant] = t.value;
    out[name] = std::move(p);
  }
  read_interface(archive, out);
  if (out.empty()) throw Pt2Error("'" + archive.name() + "' holds no exported program (no models/*.json)");
  return out;
}

std::unique_ptr<caffe2::serialize::PyTorchStreamReader> open_reader(
    const std::string& name, const std::function<std::unique_ptr<caffe2::serialize::PyTorchStreamReader>()>& open) {
  try {
    return open();
  } catch (const c10::Error& e) {
    throw Pt2Error("'" + name + "' is not a .pt2 package or is truncated (" + Archive::one_line(e) + ")");
  }
}

}  // namespace

std::map<std::string, Pt2Program> read_pt2(const std::string& path, const std::string& torch_version) {
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    throw Pt2Error("'" + path + "' cannot be read: " + std::strerror(errno));
  }
  Archive archive(open_reader(path, [&] { return std::make_unique<caffe2::serialize::PyTorchStreamReader>(path); }),
                  path, MappedFile::open(path));
  return read(archive, torch_version);
}

std::map<std::string, Pt2Program> read_pt2_bytes(const std::string& bytes, const std::string& name,
                                                 const std::string& torch_version) {
  Archive archive(open_reader(name,
                              [&] {
                                return std::make_unique<caffe2::serialize::PyTorchStreamReader>(
                                    std::make_shared<BytesReadAdapter>(bytes));
                              }),
                  name);
  return read(archive, torch_version);
}

}  // namespace kiln_exported
