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
//
// The hyperparameters (TensorBoard's hparams plugin, the HPARAMS tab) are
// two more summaries, as tensorboard.plugins.hparams.summary_v2 writes them:
// a Value of tag "_hparams_/session_start_info" or "_hparams_/session_end_info",
// tensor = 8 (an empty float tensor, hparams' NULL_TENSOR) and metadata = 9
// (SummaryMetadata: plugin_data = 1 {plugin_name = 1 "hparams", content = 2}),
// the content a serialized tensorboard.hparams.HParamsPluginData (version = 1,
// always 0; session_start_info = 3 {hparams = 1 (map<string,
// google.protobuf.Value>: number_value = 2, string_value = 3, bool_value = 4),
// start_time_secs = 5}; session_end_info = 4 {status = 1, end_time_secs = 2}).
// Field numbers from tensorboard/plugins/hparams/plugin_data.proto and
// api.proto, and google/protobuf/struct.proto.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/hparams.hpp"

namespace kiln {

// One TFRecord framing `data`.
std::string tfrecord(std::string_view data);

// Serialized Events (the record's data, not framed).
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
// The hparams plugin's session start (the run's hyperparameters, in the
// order given) and end (STATUS_SUCCESS = 1 or STATUS_FAILURE = 2).
std::string hparams_start_event(double wall_time, const std::vector<HParam>& hparams, double start_time_secs);
std::string hparams_end_event(double wall_time, int64_t step, bool success, double end_time_secs);

// The records of a file's bytes as far as they are whole and their CRCs
// match: their data, in order, and in `valid_bytes` where the last whole one
// ends. Used to check a file before continuing it.
std::vector<std::string> read_tfrecords(std::string_view bytes, size_t* valid_bytes = nullptr);

}  // namespace kiln
