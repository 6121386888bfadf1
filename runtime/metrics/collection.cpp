#include "metrics/collection.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

namespace kiln {

namespace {

std::string shape_text(const std::vector<int64_t>& trailing) {
  std::string out = "[N";
  for (int64_t d : trailing) out += ", " + std::to_string(d);
  return out + "]";
}

std::string sizes_text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

std::string column_line(const std::string& name, at::ScalarType dtype, const std::vector<int64_t>& trailing) {
  return name + " " + c10::toString(dtype) + " " + shape_text(trailing);
}

// The byte layout (one rank's rows, or a merged table):
//   "KCOL1\n", i64 rows, u32 columns, i64 index[rows], i64 batch[rows],
//   per column: u32 name length, name, i32 dtype, u32 ndim, i64 trailing[ndim],
//   u64 bytes, the rows (contiguous, native byte order).
constexpr char kMagic[] = "KCOL1\n";

class Writer {
 public:
  explicit Writer(size_t reserve) { out_.reserve(reserve); }
  template <class T>
  void put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void put_bytes(const void* data, size_t size) {
    if (size > 0) out_.append(static_cast<const char*>(data), size);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof value), sizeof value);
    return value;
  }
  const char* take(size_t size) {
    if (size > in_.size() - at_) throw std::invalid_argument("collected rows are truncated");
    const char* p = in_.data() + at_;
    at_ += size;
    return p;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  const std::string& in_;
  size_t at_ = 0;
};

struct Parsed {
  std::vector<int64_t> index, batch;
  struct Column {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> trailing;
    at::Tensor rows;  // a view of the bytes (valid while they live)
  };
  std::vector<Column> columns;
};

Parsed parse(const std::string& bytes) {
  Parsed p;
  Reader r(bytes);
  if (std::memcmp(r.take(sizeof kMagic - 1), kMagic, sizeof kMagic - 1) != 0)
    throw std::invalid_argument("collected rows have an unknown format");
  const auto rows = r.get<int64_t>();
  const auto columns = r.get<uint32_t>();
  if (rows < 0 || static_cast<uint64_t>(rows) > bytes.size() / 16) throw std::invalid_argument("collected rows are truncated");
  p.index.resize(static_cast<size_t>(rows));
  p.batch.resize(static_cast<size_t>(rows));
  const char* index = r.take(rows * sizeof(int64_t));
  const char* batch = r.take(rows * sizeof(int64_t));
  if (rows > 0) {  // an empty vector's data() may be null, which memcpy may not take
    std::memcpy(p.index.data(), index, rows * sizeof(int64_t));
    std::memcpy(p.batch.data(), batch, rows * sizeof(int64_t));
  }
  for (uint32_t c = 0; c < columns; ++c) {
    Parsed::Column col;
    const auto length = r.get<uint32_t>();
    col.name.assign(r.take(length), length);
    const auto dtype = r.get<int32_t>();
    if (dtype < 0 || dtype >= static_cast<int32_t>(at::ScalarType::NumOptions))
      throw std::invalid_argument("collected rows have an unknown dtype");
    col.dtype = static_cast<at::ScalarType>(dtype);
    const auto ndim = r.get<uint32_t>();
    if (ndim > 16) throw std::invalid_argument("collected rows have too many dimensions");
    std::vector<int64_t> sizes{rows};
    for (uint32_t d = 0; d < ndim; ++d) {
      const auto size = r.get<int64_t>();
      if (size < 0) throw std::invalid_argument("collected rows have a negative size");
      col.trailing.push_back(size);
      sizes.push_back(size);
    }
    const auto size = r.get<uint64_t>();
    const char* data = r.take(size);
    int64_t expected = static_cast<int64_t>(c10::elementSize(col.dtype));
    for (int64_t s : sizes)
      if (__builtin_mul_overflow(expected, s, &expected)) throw std::invalid_argument("collected rows are too large");
    if (static_cast<uint64_t>(expected) != size) throw std::invalid_argument("collected rows do not match their shape");
    col.rows = at::from_blob(const_cast<char*>(data), sizes, at::TensorOptions().dtype(col.dtype));
    p.columns.push_back(std::move(col));
  }
  if (!r.done()) throw std::invalid_argument("collected rows have trailing bytes");
  return p;
}

std::string serialize_columns(const std::vector<int64_t>& index, const std::vector<int64_t>& batch,
                              const std::vector<std::pair<std::string, at::Tensor>>& columns) {
  size_t total = 64 + index.size() * 16;
  for (const auto& [name, rows] : columns) total += 64 + name.size() + rows.nbytes();
  Writer w(total);
  w.put_bytes(kMagic, sizeof kMagic - 1);
  w.put<int64_t>(static_cast<int64_t>(index.size()));
  w.put<uint32_t>(static_cast<uint32_t>(columns.size()));
  w.put_bytes(index.data(), index.size() * sizeof(int64_t));
  w.put_bytes(batch.data(), batch.size() * sizeof(int64_t));
  for (const auto& [name, rows] : columns) {
    const at::Tensor data = rows.contiguous();
    w.put<uint32_t>(static_cast<uint32_t>(name.size()));
    w.put_bytes(name.data(), name.size());
    w.put<int32_t>(static_cast<int32_t>(data.scalar_type()));
    w.put<uint32_t>(static_cast<uint32_t>(data.dim() - 1));
    for (int64_t d = 1; d < data.dim(); ++d) w.put<int64_t>(data.size(d));
    w.put<uint64_t>(data.nbytes());
    w.put_bytes(data.data_ptr(), data.nbytes());
  }
  return w.take();
}

}  // namespace

Collection::Column* Collection::find(const std::string& name) {
  for (auto& c : names_)
    if (c.name == name) return &c;
  return nullptr;
}

void Collection::begin_step(const int64_t* indices, size_t count, int64_t batch) {
  step_indices_.assign(indices, indices + count);
  step_batch_ = batch;
  step_names_.clear();
  in_step_ = true;
}

std::string Collection::add(const std::string& name, const at::Tensor& rows) {
  if (!in_step_) return "collected '" + name + "' outside a step: collect in training_step, validation_step or test_step";
  if (name.empty()) return "a collected name is empty";
  if (name.rfind("kiln.", 0) == 0) return "collected '" + name + "': names beginning with \"kiln.\" are the host's";
  if (std::find(step_names_.begin(), step_names_.end(), name) != step_names_.end())
    return "collected '" + name + "' twice in one step: collect each name once per step, one row per sample";
  if (!rows.defined()) return "collected '" + name + "' as an undefined tensor";
  if (rows.layout() != at::kStrided) return "collected '" + name + "' as a sparse tensor: collect dense rows";
  if (rows.is_complex()) return "collected '" + name + "' as a complex tensor: collect real rows";
  const auto count = static_cast<int64_t>(step_indices_.size());
  if (rows.dim() == 0 || rows.size(0) != count)
    return fmt::format("collected '{}' with shape {} but the batch has {} samples: the first dimension is the batch's "
                       "samples, one row each",
                       name, sizes_text(rows.sizes()), count);
  std::vector<int64_t> trailing(rows.sizes().begin() + 1, rows.sizes().end());
  Column* column = find(name);
  if (column && (column->dtype != rows.scalar_type() || column->trailing != trailing))
    return "collected '" + name + "' as " + column_line(name, rows.scalar_type(), trailing).substr(name.size() + 1) +
           " after " + column_line(name, column->dtype, column->trailing).substr(name.size() + 1) +
           ": a name keeps its dtype and trailing shape through the epoch";
  const at::Tensor source = rows.detach();
  at::Tensor copy;
  if (source.device().is_cpu()) {
    copy = source.clone(at::MemoryFormat::Contiguous);
  } else {
    // Pinned memory and a non-blocking copy, ordered by an event read at
    // the epoch's end: the step never waits for the device.
    const bool cuda = source.is_cuda();
    copy = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(cuda));
    copy.copy_(source, /*non_blocking=*/cuda);
    if (cuda) {
      const c10::impl::VirtualGuardImpl guard(source.device().type());
      copied_.emplace(source.device().type());
      copied_->record(guard.getStream(source.device()));
    }
  }
  if (!column) {
    names_.push_back(Column{name, rows.scalar_type(), trailing, {}});
    column = &names_.back();
  }
  column->chunks.push_back(std::move(copy));
  step_names_.push_back(name);
  return "";
}

std::string Collection::end_step() {
  in_step_ = false;
  const int64_t batch = step_batch_;
  std::string problem;
  if (!step_names_.empty() || !names_.empty()) {
    const bool first = indices_.empty() && steps_with_rows_ == 0;
    if (first && steps_ > 0)
      problem = fmt::format("collected '{}' from batch {} on, but the earlier steps of the epoch collected nothing: "
                            "every step of an epoch collects the same names",
                            step_names_.empty() ? names_.front().name : step_names_.front(), batch);
    for (const auto& c : names_)
      if (problem.empty() && std::find(step_names_.begin(), step_names_.end(), c.name) == step_names_.end())
        problem = fmt::format("batch {} did not collect '{}', which {}: every step of an epoch collects the same names",
                              batch, c.name, first ? "another name of the step did" : "earlier steps did");
  }
  ++steps_;
  if (!problem.empty()) {
    // The step's rows leave with it: what is kept stays aligned.
    for (auto& c : names_)
      if (std::find(step_names_.begin(), step_names_.end(), c.name) != step_names_.end()) c.chunks.pop_back();
    names_.erase(std::remove_if(names_.begin(), names_.end(), [](const Column& c) { return c.chunks.empty(); }),
                 names_.end());
    return problem;
  }
  if (!step_names_.empty()) {
    ++steps_with_rows_;
    indices_.insert(indices_.end(), step_indices_.begin(), step_indices_.end());
    batches_.insert(batches_.end(), step_indices_.size(), batch);
  }
  return "";
}

void Collection::drop_step() {
  in_step_ = false;
  for (auto& c : names_)
    if (std::find(step_names_.begin(), step_names_.end(), c.name) != step_names_.end()) c.chunks.pop_back();
  names_.erase(std::remove_if(names_.begin(), names_.end(), [](const Column& c) { return c.chunks.empty(); }),
               names_.end());
  step_names_.clear();
}

std::vector<std::string> Collection::columns() const {
  std::vector<std::string> out;
  for (const auto& c : names_) out.push_back(column_line(c.name, c.dtype, c.trailing));
  std::sort(out.begin(), out.end());
  return out;
}

int64_t Collection::bytes() const {
  int64_t total = static_cast<int64_t>(indices_.size()) * 16;
  for (const auto& c : names_)
    for (const auto& chunk : c.chunks) total += static_cast<int64_t>(chunk.nbytes());
  return total;
}

std::string Collection::serialize() {
  if (copied_) {
    // query(), not a blocking wait: LibTorch 1.13's Event has no synchronize.
    while (!copied_->query()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    copied_.reset();
  }
  std::vector<std::pair<std::string, at::Tensor>> columns;
  std::vector<const Column*> sorted;
  for (const auto& c : names_) sorted.push_back(&c);
  std::sort(sorted.begin(), sorted.end(), [](const Column* a, const Column* b) { return a->name < b->name; });
  for (const Column* c : sorted) columns.emplace_back(c->name, at::cat(c->chunks, 0));
  return serialize_columns(indices_, batches_, columns);
}

void Collection::restore(const std::string& merged) {
  clear();
  if (merged.empty()) return;
  Parsed p = parse(merged);
  if (p.index.empty()) return;
  for (auto& c : p.columns) names_.push_back(Column{c.name, c.dtype, c.trailing, {c.rows.clone()}});
  indices_ = p.index;
  batches_.assign(p.index.size(), -1);  // before every batch of this run
  steps_ = steps_with_rows_ = 1;
}

void Collection::clear() {
  names_.clear();
  indices_.clear();
  batches_.clear();
  step_names_.clear();
  step_indices_.clear();
  steps_ = steps_with_rows_ = 0;
  in_step_ = false;
  copied_.reset();
}

std::vector<std::pair<std::string, at::Tensor>> merge_collections(const std::vector<std::string>& per_rank) {
  std::vector<Parsed> ranks;
  ranks.reserve(per_rank.size());
  for (const auto& bytes : per_rank) ranks.push_back(parse(bytes));
  // The columns every rank with rows has (the host checked them before
  // gathering; checked again here, as the bytes are what is merged).
  const Parsed* model = nullptr;
  for (const auto& r : ranks)
    if (!r.index.empty()) {
      model = &r;
      break;
    }
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (model == nullptr) {
    out.emplace_back(kIndexColumn, at::empty({0}, at::kLong));
    return out;
  }
  for (const auto& r : ranks) {
    if (r.index.empty()) continue;
    bool same = r.columns.size() == model->columns.size();
    for (size_t c = 0; same && c < r.columns.size(); ++c)
      same = r.columns[c].name == model->columns[c].name && r.columns[c].dtype == model->columns[c].dtype &&
             r.columns[c].trailing == model->columns[c].trailing;
    if (!same) throw std::invalid_argument("ranks collected different names or shapes");
  }
  // Every row by (sample index, batch, rank, position): the first of each
  // index is kept, so padding repeats and ranks never change the result.
  struct Row {
    int64_t index, batch;
    int32_t rank;
    int64_t global;  // position in the ranks' rows concatenated
  };
  std::vector<Row> rows;
  int64_t offset = 0;
  for (size_t k = 0; k < ranks.size(); ++k) {
    for (size_t i = 0; i < ranks[k].index.size(); ++i)
      rows.push_back(Row{ranks[k].index[i], ranks[k].batch[i], static_cast<int32_t>(k), offset + static_cast<int64_t>(i)});
    offset += static_cast<int64_t>(ranks[k].index.size());
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    if (a.index != b.index) return a.index < b.index;
    if (a.batch != b.batch) return a.batch < b.batch;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.global < b.global;
  });
  std::vector<int64_t> keep, index;
  for (size_t i = 0; i < rows.size(); ++i)
    if (i == 0 || rows[i].index != rows[i - 1].index) {
      keep.push_back(rows[i].global);
      index.push_back(rows[i].index);
    }
  const at::Tensor take = at::tensor(keep, at::kLong);
  out.emplace_back(kIndexColumn, at::tensor(index, at::kLong));
  for (size_t c = 0; c < model->columns.size(); ++c) {
    std::vector<at::Tensor> parts;
    for (const auto& r : ranks)
      if (!r.index.empty()) parts.push_back(r.columns[c].rows);
    out.emplace_back(model->columns[c].name, at::cat(parts, 0).index_select(0, take));
  }
  return out;
}

std::string serialize_merged(const std::vector<std::pair<std::string, at::Tensor>>& merged) {
  std::vector<int64_t> index;
  std::vector<std::pair<std::string, at::Tensor>> columns;
  for (const auto& [name, rows] : merged) {
    if (name == kIndexColumn) {
      const at::Tensor i = rows.contiguous();
      index.assign(i.data_ptr<int64_t>(), i.data_ptr<int64_t>() + i.numel());
    } else {
      columns.emplace_back(name, rows);
    }
  }
  const std::vector<int64_t> batch(index.size(), -1);
  return serialize_columns(index, batch, columns);
}

}  // namespace kiln
