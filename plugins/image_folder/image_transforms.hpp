// torchvision's transforms on PIL images, with the same names, parameters,
// defaults and pixel arithmetic:
//   resize                 Resize(size), bilinear, antialiased (PIL's resample)
//   center_crop            CenterCrop(size), zero padding where the crop is larger
//   random_resized_crop    RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3))
//   horizontal_flip        RandomHorizontalFlip(p=0.5)
//   normalize              ToTensor() then Normalize(mean, std)
// Randomness comes from a SampleRandom seeded by the host's per-sample seed
// (kiln_batch_request.sample_seeds), never from a shared generator: the
// same sample in the same epoch gets the same crop and flip with any number
// of data workers or processes, and after a resume.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "image.hpp"

namespace kiln_image {

// A small counter-free generator (splitmix64) for one sample's transforms.
class SampleRandom {
 public:
  explicit SampleRandom(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // An integer in [lo, hi).
  int64_t below(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo)); }

 private:
  uint64_t state_;
};

struct Size {
  int height = 0, width = 0;
};

// The output size of torchvision's Resize(size) for an image of `width` x
// `height`: [h, w] as given, or one number for the shorter side, the other
// scaled and truncated as torchvision does.
Size resize_target(const std::vector<int>& size, int width, int height);

// PIL's Image.resize(..., BILINEAR) for L, RGB and RGBA (RGBA as PIL does
// it: premultiplied by alpha while resampling).
Image resize_bilinear(const Image& in, int width, int height);

// PIL's Image.crop((left, top, left + width, top + height)): zeros outside.
Image crop(const Image& in, int top, int left, int height, int width);

// torchvision's CenterCrop([h, w]).
Image center_crop(const Image& in, Size size);

struct CropBox {
  int top, left, height, width;
};
// torchvision's RandomResizedCrop.get_params, drawing from `random`.
CropBox random_resized_crop_box(int width, int height, std::array<double, 2> scale, std::array<double, 2> ratio,
                                SampleRandom& random);

Image horizontal_flip(const Image& in);

// One transform of a pipeline, as the manifest names it.
struct Transform {
  enum class Kind { resize, center_crop, random_resized_crop, horizontal_flip, normalize } kind;
  std::vector<int> size;                       // resize: [s] or [h, w]; crops: [h, w]
  std::array<double, 2> scale{0.08, 1.0};      // random_resized_crop
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
  double p = 0.5;                              // horizontal_flip
  std::vector<float> mean, std;                // normalize: one per channel
};

// The pipeline's 8-bit part (every transform but normalize), in order.
Image apply_geometry(Image image, const std::vector<Transform>& transforms, SampleRandom& random);

// ToTensor and Normalize: `out` (channels * height * width floats, CHW)
// gets x / 255, then (x - mean) / std when the pipeline normalizes, in
// float32 as torchvision computes it.
void to_chw_float(const Image& image, const std::vector<Transform>& transforms, float* out);

}  // namespace kiln_image
