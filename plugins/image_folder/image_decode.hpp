// JPEG (libjpeg-turbo) and PNG (libpng) files decoded to the pixels PIL's
// Image.open(...).convert(mode) gives:
//   - PNG: exactly PIL's, for 1/2/4/8-bit grey, grey+alpha, RGB, RGBA and
//     palette images (with or without tRNS), interlaced or not, and 16-bit
//     colour (the high byte, as PIL). 16-bit grey: the high byte, where PIL's
//     "I;16" to "L" conversion clips at 255 (docs/data.md).
//   - JPEG: libjpeg's default decode (islow IDCT, fancy upsampling), which is
//     PIL's: equal where both use the same libjpeg-turbo, within 1 per
//     channel where their IDCTs differ. CMYK JPEGs are refused.
// The format comes from the file's first bytes, not its name.
#pragma once

#include <cstdint>
#include <string>

#include "image.hpp"

namespace kiln_image {

// `bytes` is the whole file; `name` only names it in errors. `channels`: 1
// (PIL's "L": 0.299 R + 0.587 G + 0.114 B in PIL's fixed point), 3 ("RGB")
// or 4 ("RGBA"); alpha is dropped, never composited, as PIL's convert does.
// Throws ImageError, also for an image of more than `max_pixels` (checked
// from the header, before any pixel is allocated: a header can claim
// 65535 x 65535 in a file of a few hundred bytes). The default is PIL's
// decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS).
constexpr uint64_t kMaxPixels = 178956970;
Image decode_image(const std::string& bytes, const std::string& name, int channels, uint64_t max_pixels = kMaxPixels);

// The image's channels as PIL's convert would give `channels` (1, 3 or 4).
Image convert_channels(Image image, int channels);

}  // namespace kiln_image
