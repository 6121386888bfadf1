// An 8-bit image as kiln_image_folder handles it between decoding and the
// batch: rows of interleaved channels (HWC), as PIL keeps it. No LibTorch
// here: the decoders, the transforms and their tests and fuzz target build
// without it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln_image {

struct Image {
  int width = 0, height = 0, channels = 0;  // channels: 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA)
  std::vector<uint8_t> pixels;              // height * width * channels

  Image() = default;
  Image(int w, int h, int c) : width(w), height(h), channels(c), pixels(static_cast<size_t>(w) * h * c) {}
  uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * width * channels; }
  const uint8_t* row(int y) const { return pixels.data() + static_cast<size_t>(y) * width * channels; }
};

// A file that is not an image kiln reads, or a damaged one. The message
// names the file and what is wrong, on one line.
class ImageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kiln_image
