#include "image_transforms.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln_image {

namespace {

// --- PIL's resampling (Pillow's libImaging/Resample.c), bilinear ------------
//
// Separable: a horizontal pass into an 8-bit image, then a vertical one.
// Each output pixel is a weighted sum of the input pixels under a triangle
// filter widened by the scale when shrinking (so it antialiases), with the
// weights normalised, then rounded to 22-bit fixed point: the same numbers
// PIL computes, hence the same bytes.

constexpr int kPrecisionBits = 32 - 8 - 2;

double bilinear(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

struct Coefficients {
  int ksize = 0;
  std::vector<int> bounds;  // per output pixel: first input index, count
  std::vector<int32_t> k;   // per output pixel: ksize fixed-point weights
};

Coefficients precompute(int in_size, double in0, double in1, int out_size) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> w(static_cast<size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = bilinear((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      c.k[static_cast<size_t>(xx) * c.ksize + x] =
          v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits)) : static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t ss) {
  const int32_t v = ss >> kPrecisionBits;  // arithmetic, as PIL's lookup table index
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Rows [first, first + out.height) of `in`, columns from `xmins`,
// resampled horizontally.
void horizontal(const Image& in, int first, const Coefficients& c, const std::vector<int>& xmins, Image& out) {
  const int ch = in.channels;
  for (int yy = 0; yy < out.height; ++yy) {
    const uint8_t* src = in.row(yy + first);
    uint8_t* dst = out.row(yy);
    for (int xx = 0; xx < out.width; ++xx) {
      const int xmin = xmins[xx], xmax = c.bounds[xx * 2 + 1];
      const int32_t* k = &c.k[static_cast<size_t>(xx) * c.ksize];
      for (int b = 0; b < ch; ++b) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < xmax; ++x) ss += static_cast<int32_t>(src[(x + xmin) * ch + b]) * k[x];
        dst[xx * ch + b] = clip8(ss);
      }
    }
  }
}

// Columns [first, first + out.width) of `in`, rows from `ymins`, resampled
// vertically.
void vertical(const Image& in, int first, const Coefficients& c, const std::vector<int>& ymins, Image& out) {
  const int ch = in.channels;
  const size_t in_stride = static_cast<size_t>(in.width) * ch, out_stride = static_cast<size_t>(out.width) * ch;
  const size_t offset = static_cast<size_t>(first) * ch;
  for (int yy = 0; yy < out.height; ++yy) {
    const int ymin = ymins[yy], ymax = c.bounds[yy * 2 + 1];
    const int32_t* k = &c.k[static_cast<size_t>(yy) * c.ksize];
    uint8_t* dst = out.row(yy);
    for (size_t i = 0; i < out_stride; ++i) {
      int32_t ss = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < ymax; ++y)
        ss += static_cast<int32_t>(in.pixels[static_cast<size_t>(ymin + y) * in_stride + offset + i]) * k[y];
      dst[i] = clip8(ss);
    }
  }
}

std::vector<int> starts(const Coefficients& c, int n, int shift) {
  std::vector<int> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[i] = c.bounds[i * 2] - shift;
  return out;
}

Image resample(const Image& in, int width, int height) {
  const bool need_horizontal = width != in.width, need_vertical = height != in.height;
  const Coefficients ch = precompute(in.width, 0.0, in.width, width);
  const Coefficients cv = precompute(in.height, 0.0, in.height, height);
  if (!need_horizontal) {
    Image out(width, height, in.channels);
    vertical(in, 0, cv, starts(cv, height, 0), out);
    return out;
  }
  if (!need_vertical) {
    Image out(width, height, in.channels);
    horizontal(in, 0, ch, starts(ch, width, 0), out);
    return out;
  }
  // Both: the horizontal pass first, into an 8-bit image of only the rows
  // the vertical pass reads (Pillow up to 12.x; Pillow 13 sometimes runs the
  // vertical pass first, which rounds the intermediate differently: at most
  // 1 apart, docs/data.md).
  const int first = cv.bounds[0], last = cv.bounds[(height - 1) * 2] + cv.bounds[(height - 1) * 2 + 1];
  Image temp(width, last - first, in.channels);
  horizontal(in, first, ch, starts(ch, width, 0), temp);
  Image out(width, height, in.channels);
  vertical(temp, 0, cv, starts(cv, height, first), out);
  return out;
}

// PIL's RGBA <-> RGBa (premultiplied) conversions, which Image.resize wraps
// around resampling an RGBA image.
uint8_t muldiv255(unsigned a, unsigned b) {
  const unsigned tmp = a * b + 128;
  return static_cast<uint8_t>(((tmp >> 8) + tmp) >> 8);
}

void premultiply(Image& image) {
  for (size_t i = 0; i + 3 < image.pixels.size(); i += 4)
    for (int b = 0; b < 3; ++b) image.pixels[i + b] = muldiv255(image.pixels[i + b], image.pixels[i + 3]);
}

void unpremultiply(Image& image) {
  for (size_t i = 0; i + 3 < image.pixels.size(); i += 4) {
    const unsigned alpha = image.pixels[i + 3];
    if (alpha == 255 || alpha == 0) continue;
    for (int b = 0; b < 3; ++b)
      image.pixels[i + b] = static_cast<uint8_t>(std::min(255u, 255u * image.pixels[i + b] / alpha));
  }
}

int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }  // Python's round(): half to even

Size square_or_pair(const std::vector<int>& size) {
  return size.size() == 1 ? Size{size[0], size[0]} : Size{size[0], size[1]};
}

}  // namespace

Size resize_target(const std::vector<int>& size, int width, int height) {
  if (size.size() == 2) return Size{size[0], size[1]};
  const int shorter = std::min(width, height), longer = std::max(width, height);
  const int new_short = size[0];
  const int new_long = static_cast<int>(static_cast<double>(new_short) * longer / shorter);
  return width <= height ? Size{new_long, new_short} : Size{new_short, new_long};
}

Image resize_bilinear(const Image& in, int width, int height) {
  if (width == in.width && height == in.height) return in;
  if (in.channels != 4) return resample(in, width, height);
  Image premultiplied = in;
  premultiply(premultiplied);
  Image out = resample(premultiplied, width, height);
  unpremultiply(out);
  return out;
}

Image crop(const Image& in, int top, int left, int height, int width) {
  Image out(width, height, in.channels);  // zeros
  const int ch = in.channels;
  for (int y = 0; y < height; ++y) {
    const int sy = top + y;
    if (sy < 0 || sy >= in.height) continue;
    const int x0 = std::max(0, -left), x1 = std::min(width, in.width - left);
    if (x1 > x0)
      std::memcpy(out.row(y) + static_cast<size_t>(x0) * ch, in.row(sy) + static_cast<size_t>(left + x0) * ch,
                  static_cast<size_t>(x1 - x0) * ch);
  }
  return out;
}

Image center_crop(const Image& in, Size size) {
  const int ch = size.height, cw = size.width;
  int w = in.width, h = in.height, pad_left = 0, pad_top = 0;
  if (cw > w || ch > h) {
    // torchvision pads first (left and top get the smaller half), then crops.
    if (cw > w) pad_left = (cw - w) / 2;
    if (ch > h) pad_top = (ch - h) / 2;
    if (cw > w) w = cw;
    if (ch > h) h = ch;
  }
  const int top = py_round((h - ch) / 2.0), left = py_round((w - cw) / 2.0);
  return crop(in, top - pad_top, left - pad_left, ch, cw);
}

CropBox random_resized_crop_box(int width, int height, std::array<double, 2> scale, std::array<double, 2> ratio,
                                SampleRandom& random) {
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.uniform(scale[0], scale[1]);
    const double aspect = std::exp(random.uniform(log_lo, log_hi));
    const int w = py_round(std::sqrt(target_area * aspect));
    const int h = py_round(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int i = static_cast<int>(random.below(0, height - h + 1));
      const int j = static_cast<int>(random.below(0, width - w + 1));
      return CropBox{i, j, h, w};
    }
  }
  // torchvision's fallback: a central crop at the nearest allowed ratio.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < std::min(ratio[0], ratio[1])) {
    h = py_round(w / std::min(ratio[0], ratio[1]));
  } else if (in_ratio > std::max(ratio[0], ratio[1])) {
    w = py_round(h * std::max(ratio[0], ratio[1]));
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

Image horizontal_flip(const Image& in) {
  Image out(in.width, in.height, in.channels);
  const int ch = in.channels;
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* src = in.row(y);
    uint8_t* dst = out.row(y);
    for (int x = 0; x < in.width; ++x) std::memcpy(dst + static_cast<size_t>(x) * ch, src + static_cast<size_t>(in.width - 1 - x) * ch, ch);
  }
  return out;
}

Image apply_geometry(Image image, const std::vector<Transform>& transforms, SampleRandom& random) {
  for (const Transform& t : transforms) {
    switch (t.kind) {
      case Transform::Kind::resize: {
        const Size s = resize_target(t.size, image.width, image.height);
        image = resize_bilinear(image, s.width, s.height);
        break;
      }
      case Transform::Kind::center_crop: image = center_crop(image, square_or_pair(t.size)); break;
      case Transform::Kind::random_resized_crop: {
        const CropBox box = random_resized_crop_box(image.width, image.height, t.scale, t.ratio, random);
        const Size s = square_or_pair(t.size);
        image = resize_bilinear(crop(image, box.top, box.left, box.height, box.width), s.width, s.height);
        break;
      }
      case Transform::Kind::horizontal_flip:
        if (random.uniform(0.0, 1.0) < t.p) image = horizontal_flip(image);
        break;
      case Transform::Kind::normalize: break;  // to_chw_float
    }
  }
  return image;
}

void to_chw_float(const Image& image, const std::vector<Transform>& transforms, float* out) {
  const Transform* normalize = nullptr;
  for (const Transform& t : transforms)
    if (t.kind == Transform::Kind::normalize) normalize = &t;
  const size_t plane = static_cast<size_t>(image.width) * image.height;
  const int ch = image.channels;
  for (int c = 0; c < ch; ++c) {
    float* dst = out + plane * c;
    const uint8_t* src = image.pixels.data() + c;
    if (normalize) {
      const float mean = normalize->mean[c], std = normalize->std[c];
      for (size_t i = 0; i < plane; ++i) dst[i] = (static_cast<float>(src[i * ch]) / 255.0f - mean) / std;
    } else {
      for (size_t i = 0; i < plane; ++i) dst[i] = static_cast<float>(src[i * ch]) / 255.0f;
    }
  }
}

}  // namespace kiln_image
