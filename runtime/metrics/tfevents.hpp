// TensorBoard's event-file format, written without TensorFlow or a protobuf
// runtime. A file is a sequence of TFRecords:
//   uint64 length, uint32 masked CRC-32C of those 8 bytes,
//   `length` bytes of data, uint32 masked CRC-32C of the data
// (all little-endian), each record's data a serialized tensorflow.Event:
//   wall_time = 1 (double), step = 2 (int64), and one of
//   file_version = 3 (string), summary = 5 (Summary), session_log = 7.
// Summary: repeated Value value = 1; Value: tag = 1 (string),
// simple_value = 2 (float) — the scalar form every TensorBoard reads.
// The first event of a file carries file_version "brain.Event:2".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

// One TFRecord framing `data`.
std::string tfrecord(std::string_view data);

// Serialized Events (the record's data, not framed).
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);

// The records of a file's bytes as far as they are whole and their CRCs
// match: their data, in order, and in `valid_bytes` where the last whole one
// ends. Used to check a file before continuing it.
std::vector<std::string> read_tfrecords(std::string_view bytes, size_t* valid_bytes = nullptr);

}  // namespace kiln
