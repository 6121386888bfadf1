// A validation split held out of train's rows (a data module's
// `val_fraction`): a permutation seeded by `seed`, so the same rows on every
// rank and in every run with that seed, recorded in the run directory as
// <plugin id>/val_rows.npy and train_rows.npy (sorted int64 row numbers of
// the train file, for np.load).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kiln/plugin.hpp"

namespace kiln_plugins {

struct HeldOut {
  at::Tensor train_rows, val_rows;  // sorted int64
};

inline HeldOut hold_out(int64_t length, double fraction, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor order = at::randperm(length, gen, at::kLong);
  const auto held = static_cast<int64_t>(std::llround(fraction * static_cast<double>(length)));
  return HeldOut{std::get<0>(order.slice(0, held).sort()), std::get<0>(order.slice(0, 0, held).sort())};
}

// A 1-D int64 tensor as a .npy file's bytes (format 1.0, little-endian).
inline std::string npy_of_int64(const at::Tensor& values) {
  const at::Tensor v = values.to(at::kLong).contiguous();
  std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (" + std::to_string(v.numel()) + ",), }";
  // NumPy pads the header with spaces and a newline to a multiple of 64.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  const int64_t* data = v.data_ptr<int64_t>();
  for (int64_t i = 0; i < v.numel(); ++i) {
    const auto u = static_cast<uint64_t>(data[i]);
    for (int b = 0; b < 8; ++b) out += static_cast<char>((u >> (8 * b)) & 0xff);
  }
  return out;
}

// Records the rows in the run directory and says so in one log line.
inline void record_held_out(const kiln::Host& host, const std::string& plugin_id, const HeldOut& split,
                            double fraction, uint64_t seed) {
  const bool saved = host.write_run_file("val_rows.npy", npy_of_int64(split.val_rows)) &&
                     host.write_run_file("train_rows.npy", npy_of_int64(split.train_rows));
  const int64_t held = split.val_rows.numel(), total = held + split.train_rows.numel();
  host.info("val: " + std::to_string(held) + " of train's " + std::to_string(total) + " rows held out (val_fraction " +
            std::to_string(fraction) + ", seed " + std::to_string(seed) +
            (saved ? "); their row numbers: <run dir>/" + plugin_id + "/val_rows.npy" : ")"));
}

// Makes `val` the held-out rows of `train` (each a split with `rows` and
// `length`, sharing train's data) and records them.
template <class Split>
void hold_out_val(const kiln::Host& host, const std::string& plugin_id, Split& train, Split& val, double fraction,
                  uint64_t seed) {
  const HeldOut held = hold_out(train.length, fraction, seed);
  val = train;
  val.rows = held.val_rows;
  val.length = held.val_rows.numel();
  train.rows = held.train_rows;
  train.length = held.train_rows.numel();
  record_held_out(host, plugin_id, held, fraction, seed);
}

}  // namespace kiln_plugins
