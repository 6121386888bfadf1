// kiln_image_folder's decoders (libjpeg-turbo, libpng behind
// plugins/image_folder/image_decode.hpp) and its transforms on what they
// decode. The contract: an ImageError of one line, or an image whose pixel
// buffer is exactly width x height x channels, which the transforms turn
// into images of the sizes asked for.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "image_decode.hpp"
#include "image_transforms.hpp"

namespace {

void check(const kiln_image::Image& image, int width, int height, int channels) {
  if (image.width != width || image.height != height || image.channels != channels) std::abort();
  if (image.pixels.size() != static_cast<size_t>(width) * height * channels) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int channels = data[0] % 3 == 0 ? 1 : data[0] % 3 == 1 ? 3 : 4;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  kiln_image::Image image;
  try {
    // A small limit: a header may claim any size; the fuzzer's memory is 256 MiB.
    image = kiln_image::decode_image(bytes, "fuzz.img", channels, uint64_t{1} << 20);
  } catch (const kiln_image::ImageError& e) {
    const std::string what = e.what();
    if (what.rfind("'fuzz.img': ", 0) != 0 || what.find('\n') != std::string::npos) std::abort();
    return 0;
  }
  check(image, image.width, image.height, channels);
  kiln_image::SampleRandom random(size);
  const kiln_image::Image resized = kiln_image::resize_bilinear(image, 7, 5);
  check(resized, 7, 5, channels);
  check(kiln_image::center_crop(image, {6, 9}), 9, 6, channels);
  const kiln_image::CropBox box = kiln_image::random_resized_crop_box(image.width, image.height, {0.08, 1.0}, {0.75, 4.0 / 3}, random);
  if (box.top < 0 || box.left < 0 || box.top + box.height > image.height || box.left + box.width > image.width) std::abort();
  check(kiln_image::horizontal_flip(image), image.width, image.height, channels);
  return 0;
}
