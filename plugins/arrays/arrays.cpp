// kiln.arrays — named arrays from NumPy's .npy and .npz files and
// .safetensors files, memory-mapped: a batch gathers its rows straight from
// the page cache, so a file far larger than memory trains without being read
// in (a .npz member is read into memory: deflated, or stored at an offset
// LibTorch cannot view).
//
// [data]
// path = "kiln_arrays"
// train = "train.safetensors"       # a .safetensors or .npz file, or .npy files:
//                                   # ["train/x.npy", "train/y.npy"] (a .npy's key is its stem)
// val = "val.safetensors"           # optional; or
// val_fraction = 0.1                # held out of train: a permutation seeded by `seed`;
//                                   # the rows: <run dir>/kiln.arrays/val_rows.npy
// test = "test.safetensors"         # optional; also the predict split
// input = "x"                       # the key also served as the batch's "input": floats,
//                                   # uint8 (images) and bools as float32, other integers
//                                   # (token ids) as int64 ("" = none; by default "input"
//                                   # when the split has it)
// target = "y"                      # the key also served as "target": integers and bools as
//                                   # int64 class indices, floats as float32 ("" = none; by
//                                   # default "target" when the split has it)
// seed = 0
//
// Every array of the split whose first dimension is the split's samples is
// also served under its own name (input_ids, attention_mask, labels, as a
// tokenizer names them): floats as float32, integers and bools as int64, so
// token ids reach an embedding exactly. An array of another length (a
// table of class names, say) is left out, with a line saying so. A
// Fortran-order .npy is read in its logical order.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "array_file.hpp"
#include "kiln/plugin.hpp"
#include "kiln_plugins/by_split.hpp"
#include "kiln_plugins/held_out.hpp"
#include "kiln_plugins/sample_index.hpp"

namespace {

constexpr const char* kId = "kiln.arrays";

at::ScalarType scalar_type(kiln_arrays::DType dtype) {
  using kiln_arrays::DType;
  switch (dtype) {
    case DType::float64: return at::kDouble;
    case DType::float32: return at::kFloat;
    case DType::float16: return at::kHalf;
    case DType::bfloat16: return at::kBFloat16;
    case DType::int64: return at::kLong;
    case DType::int32: return at::kInt;
    case DType::int16: return at::kShort;
    case DType::int8: return at::kChar;
    case DType::uint8: return at::kByte;
    case DType::boolean: return at::kBool;
  }
  return at::kByte;
}

// A view of the mapped bytes, in the array's logical order. Rows whose start
// is not aligned to the item size (a safetensors header of odd length) are
// copied once into aligned memory instead.
at::Tensor tensor_of(const kiln_arrays::ArrayView& view) {
  std::vector<int64_t> sizes = view.shape;
  if (view.fortran_order) std::reverse(sizes.begin(), sizes.end());
  const auto type = scalar_type(view.dtype);
  void* data = const_cast<unsigned char*>(view.data);
  at::Tensor t;
  if (reinterpret_cast<uintptr_t>(data) % kiln_arrays::item_size(view.dtype) != 0) {
    t = at::empty(sizes, at::TensorOptions().dtype(type));
    if (view.bytes) std::memcpy(t.data_ptr(), view.data, view.bytes);
  } else {
    t = at::from_blob(data, sizes, at::TensorOptions().dtype(type));
  }
  if (view.fortran_order) {
    std::vector<int64_t> order(sizes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(order.size() - 1 - i);
    t = t.permute(order);
  }
  return t;
}

// One array of a split. A C-order array stored in its file (a .npy, a
// safetensors tensor, a stored .npz member) is read row by row with pread:
// a batch costs its own bytes, and the file's pages stay out of the
// process's RSS (a 4 GiB file trains in ~100 MiB of RSS; reading through
// the mapping counted every page touched: bench/arrays_rss.sh). Others (a
// Fortran-order .npy, an inflated .npz member) are views into memory.
struct Column {
  at::Tensor view;                                    // when not read from the file
  std::shared_ptr<const kiln_arrays::MappedFile> file;  // else pread from here
  uint64_t offset = 0;                                // of row 0
  size_t row_bytes = 0;
  std::vector<int64_t> sizes;                         // [rows, ...]
  at::ScalarType type = at::kFloat;

  bool defined() const { return view.defined() || file != nullptr; }
  int64_t dim() const { return view.defined() ? view.dim() : static_cast<int64_t>(sizes.size()); }
  int64_t rows() const { return view.defined() ? view.size(0) : sizes[0]; }
  at::ScalarType scalar_type() const { return view.defined() ? view.scalar_type() : type; }

  at::Tensor take(const at::Tensor& index) const {
    if (view.defined()) return view.index_select(0, index);
    std::vector<int64_t> out_sizes = sizes;
    out_sizes[0] = index.numel();
    at::Tensor out = at::empty(out_sizes, at::TensorOptions().dtype(type));
    auto* to = static_cast<unsigned char*>(out.data_ptr());
    const at::Tensor order = index.contiguous();
    const int64_t* rows = order.data_ptr<int64_t>();
    for (int64_t i = 0; i < index.numel(); ++i)
      file->read_at(offset + static_cast<uint64_t>(rows[i]) * row_bytes, to + static_cast<size_t>(i) * row_bytes, row_bytes);
    return out;
  }
};

// An array as a Column: read from its file when it is C-order bytes there.
Column column_of(const kiln_arrays::ArrayFile& file, const kiln_arrays::ArrayView& view) {
  Column c;
  const unsigned char* begin = file.mapping->data();
  const bool in_file = begin != nullptr && view.data >= begin && view.data + view.bytes <= begin + file.mapping->size();
  if (view.fortran_order || view.shape.empty() || !in_file || view.shape[0] == 0) {
    c.view = tensor_of(view);
    return c;
  }
  c.file = file.mapping;
  c.offset = static_cast<uint64_t>(view.data - begin);
  c.sizes = view.shape;
  c.type = scalar_type(view.dtype);
  c.row_bytes = view.bytes / static_cast<size_t>(view.shape[0]);
  return c;
}

// How a served array is converted: "input" keeps what a float model read
// before named arrays (uint8 images and bools as float32); a named array
// keeps integers exact.
at::Tensor as_input(const at::Tensor& t) {
  const auto type = t.scalar_type();
  if (c10::isFloatingType(type) || type == at::kByte || type == at::kBool) return t.to(at::kFloat);
  return t.to(at::kLong);
}
at::Tensor as_named(const at::Tensor& t) {
  return c10::isFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t.to(at::kLong);
}

struct Split {
  std::vector<kiln_arrays::ArrayFile> files;  // keep the mappings alive
  Column input, target;
  std::vector<std::pair<std::string, Column>> named;  // every array with one row a sample
  at::Tensor rows;                            // int64 row numbers when the split is a subset (val_fraction)
  int64_t length = 0;
};

class Arrays final : public kiln::DataModule {
 public:
  Arrays(const kiln::Host& host, kiln::Config& config) : DataModule(host) {
    train_files_ = files(config, "train", true);
    val_files_ = files(config, "val", false);
    test_files_ = files(config, "test", false);
    // Unset, "input" and "target" are read when the split has them.
    input_given_ = config.table().get("input") != nullptr;
    target_given_ = config.table().get("target") != nullptr;
    input_key_ = config.get<std::string>("input", "input");
    target_key_ = config.get<std::string>("target", "target");
    val_fraction_ = config.get<double>("val_fraction", 0.0);
    seed_ = static_cast<uint64_t>(config.get<int64_t>("seed", 0));
    if (!(val_fraction_ >= 0.0 && val_fraction_ < 1.0))
      throw kiln::ConfigError("'val_fraction' must be in [0, 1), got " + std::to_string(val_fraction_));
    if (val_fraction_ > 0.0 && !val_files_.empty())
      throw kiln::ConfigError("'val' and 'val_fraction' both name a validation split; keep one");
  }

  void setup(kiln::Stage) override {
    train_ = load(train_files_);
    val_ = val_files_.empty() ? Split{} : load(val_files_);
    test_ = test_files_.empty() ? Split{} : load(test_files_);
    if (val_fraction_ > 0.0) kiln_plugins::hold_out_val(host(), kId, train_, val_, val_fraction_, seed_);
  }

  void teardown(kiln::Stage, bool) override { train_ = val_ = test_ = Split{}; }

  int64_t length(kiln::Split split) override { return select(split).length; }

  // Read-only over fixed mappings, hence KILN_DATA_CONCURRENT_GET_BATCH.
  kiln::TensorMap get_batch(kiln::Split split, const int64_t* indices, size_t count) override {
    const Split& data = select(split);
    at::Tensor index = kiln_plugins::sample_index(indices, count, data.length);
    if (data.rows.defined()) index = data.rows.index_select(0, index);
    kiln::TensorMap batch;
    // The input's and target's rows are read once, whatever names they go by.
    at::Tensor input, target;
    if (data.input.defined()) {
      input = data.input.take(index);
      batch.emplace_back("input", as_input(input));
    }
    if (data.target.defined()) {
      target = data.target.take(index);
      batch.emplace_back("target", c10::isFloatingType(target.scalar_type()) ? target.to(at::kFloat) : target.to(at::kLong));
    }
    for (const auto& [key, column] : data.named) {
      if (key == "input" || key == "target") continue;
      const at::Tensor rows = key == input_key_ && input.defined()    ? input
                              : key == target_key_ && target.defined() ? target
                                                                      : column.take(index);
      batch.emplace_back(key, as_named(rows));
    }
    return batch;
  }

 private:
  static std::vector<std::string> files(kiln::Config& config, const std::string& key, bool required) {
    const toml::node* node = config.table().get(key);
    if (node && node->is_array()) return config.get_list<std::string>(key, {});
    const std::string one = config.get<std::string>(key, "");
    if (one.empty()) {
      if (required) throw kiln::ConfigError("missing required key '" + key + "' (a .safetensors file or .npy files)");
      return {};
    }
    return {one};
  }

  Split load(const std::vector<std::string>& paths) const {
    Split split;
    try {
      for (const auto& path : paths) split.files.push_back(kiln_arrays::ArrayFile::open(path));
      std::vector<std::string> keys;
      for (const auto& file : split.files)
        for (const auto& array : file.arrays) keys.push_back(array.key);
      const auto find = [&](const std::string& key, bool required)
          -> std::pair<const kiln_arrays::ArrayFile*, const kiln_arrays::ArrayView*> {
        for (const auto& file : split.files)
          for (const auto& array : file.arrays)
            if (array.key == key) return {&file, &array};
        if (!required) return {nullptr, nullptr};
        throw kiln_arrays::ArrayFileError("'" + join(paths) + "' has no array '" + key + "'; it has: " +
                                          kiln_arrays::key_list(keys));
      };
      // The samples: the input's rows, else the first array's.
      std::string rows_key;
      std::string rows_file;
      if (!input_key_.empty()) {
        const auto [input_file, input] = find(input_key_, input_given_);
        if (input != nullptr) {
          if (input->shape.empty())
            throw kiln_arrays::ArrayFileError("'" + input_file->path + "': '" + input_key_ +
                                              "' is a scalar, not one row per sample");
          split.input = column_of(*input_file, *input);
          split.length = split.input.rows();
          rows_key = input_key_;
          rows_file = input_file->path;
        }
      }
      if (rows_key.empty()) {
        for (const auto& file : split.files)
          for (const auto& array : file.arrays)
            if (rows_key.empty() && !array.shape.empty()) {
              split.length = array.shape[0];
              rows_key = array.key;
              rows_file = file.path;
            }
        if (rows_key.empty())
          throw kiln_arrays::ArrayFileError("'" + join(paths) + "' holds no array with one row per sample");
      }
      if (!target_key_.empty()) {
        const auto [target_file, target] = find(target_key_, target_given_);
        if (target != nullptr) {
          split.target = column_of(*target_file, *target);
          if (split.target.dim() == 0 || split.target.rows() != split.length)
            throw kiln_arrays::ArrayFileError(
                "'" + target_file->path + "': '" + target_key_ + "' has " +
                (split.target.dim() == 0 ? std::string("no rows (a scalar)")
                                         : std::to_string(split.target.rows()) + " rows") +
                " but '" + rows_key + "' in '" + rows_file + "' has " + std::to_string(split.length));
        }
      }
      std::vector<std::string> left_out;
      for (const auto& file : split.files)
        for (const auto& array : file.arrays) {
          if (array.shape.empty() || array.shape[0] != split.length) {
            left_out.push_back(array.key);
            continue;
          }
          split.named.emplace_back(array.key, column_of(file, array));
        }
      if (!left_out.empty())
        host().info("'" + join(paths) + "': " + kiln_arrays::key_list(left_out) + " not served (not one row for each of the " +
                    std::to_string(split.length) + " samples of '" + rows_key + "')");
    } catch (const kiln_arrays::ArrayFileError& e) {
      throw kiln::InvalidInput(e.what());
    }
    return split;
  }

  static std::string join(const std::vector<std::string>& paths) {
    std::string out;
    for (const auto& p : paths) out += (out.empty() ? "" : "', '") + p;
    return out;
  }

  const Split& select(kiln::Split split) const { return kiln_plugins::by_split(split, train_, val_, test_); }

  std::vector<std::string> train_files_, val_files_, test_files_;
  std::string input_key_, target_key_;
  bool input_given_ = false, target_given_ = false;
  double val_fraction_ = 0.0;
  uint64_t seed_ = 0;
  Split train_, val_, test_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<Arrays>(
    {kId, "Arrays from .npy, .npz and .safetensors", "0.1.0",
     "Named arrays from NumPy .npy and .npz files and .safetensors files, memory-mapped",
     KILN_DATA_CONCURRENT_GET_BATCH}))
