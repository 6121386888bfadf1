// `kiln export`: a checkpoint's model weights, under the dotted names the
// model plugin reports (torch.nn's state_dict names: parameters, then
// buffers), in a file the rest of the ecosystem reads: safetensors, or a
// torch.load-able dict of tensors (.pt). No LibTorch in this header.
#pragma once

#include <filesystem>
#include <optional>

namespace kiln {

enum class ExportFormat { safetensors, pt };

struct ExportRequest {
  std::filesystem::path checkpoint;
  ExportFormat format = ExportFormat::safetensors;
  std::optional<std::filesystem::path> output;  // default: the checkpoint's name with .safetensors / .pt, beside it
  bool overwrite = false;                       // an existing output is refused unless set
  // A checkpoint with averaged weights ([averaging]) exports those, unless set.
  bool trained_weights = false;
};

struct ExportResult {
  std::filesystem::path file;
  size_t tensors = 0;
  size_t bytes = 0;
  bool averaged = false;  // the averaged weights were written
};

// Reads and validates the checkpoint, then writes the file durably (a crash
// leaves the old file or none, never half of one). Throws InputError (one
// line, exit 2) for an unusable checkpoint, an existing output without
// `overwrite`, or an output directory that does not exist; nothing is
// written then.
ExportResult export_weights(const ExportRequest& request);

}  // namespace kiln
