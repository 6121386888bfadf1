// kiln_image_folder's decoders and transforms against PIL and torchvision
// (tests/images/pil_reference.py writes the images and what PIL and
// torchvision make of them): PNG pixels equal PIL's, JPEG within 1 per
// channel, every transform equal to torchvision's on PIL images, and
// damaged files refused with one line naming the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../plugins/image_folder/image_decode.hpp"
#include "../../plugins/image_folder/image_transforms.hpp"
#include "support/run_process.hpp"

namespace kiln::test {
namespace {

using kiln_image::Image;

// A uint8 .npy of shape (h, w) or (h, w, c), as np.save writes it.
Image read_npy(const std::filesystem::path& file) {
  const std::string bytes = read_file(file);
  const size_t header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_NE(header.find("'|u1'"), std::string::npos) << file << ": " << header;
  const size_t open = header.find("'shape': (") + 10;
  std::vector<int> shape;
  std::istringstream dims(header.substr(open, header.find(')', open) - open));
  for (std::string d; std::getline(dims, d, ',');)
    if (d.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoi(d));
  Image image(shape.at(1), shape.at(0), shape.size() == 3 ? shape[2] : 1);
  std::memcpy(image.pixels.data(), bytes.data() + 10 + header_len, image.pixels.size());
  return image;
}

int channels_of(const std::string& mode) { return mode == "L" ? 1 : mode == "RGB" ? 3 : 4; }

// The largest difference of one channel value, or -1 when the shapes differ.
int max_difference(const Image& a, const Image& b) {
  if (a.width != b.width || a.height != b.height || a.channels != b.channels) return -1;
  int worst = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) worst = std::max(worst, std::abs(a.pixels[i] - b.pixels[i]));
  return worst;
}

std::string shape(const Image& i) {
  return std::to_string(i.height) + "x" + std::to_string(i.width) + "x" + std::to_string(i.channels);
}

class ImageReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (check_python().empty()) return;
    dir_ = new TempDir("kiln-images");
    const ProcessResult r = run_process(
        {check_python().string(), (source_dir() / "tests" / "images" / "pil_reference.py").string(), dir_->path().string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { KILN_REQUIRE_CHECK_PYTHON(); }
  static std::filesystem::path dir() { return dir_->path(); }
  static TempDir* dir_;
};
TempDir* ImageReference::dir_ = nullptr;

TEST_F(ImageReference, PngPixelsEqualPilsAndJpegPixelsAreWithinOne) {
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir())) {
    const std::string name = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    if (ext != ".png" && ext != ".jpg") continue;
    if (!std::filesystem::exists(dir() / (name + ".RGB.npy"))) continue;  // a damaged one
    for (const std::string mode : {"L", "RGB", "RGBA"}) {
      const Image ours = kiln_image::decode_image(read_file(entry.path()), name, channels_of(mode));
      const Image pil = read_npy(dir() / (name + "." + mode + ".npy"));
      const int diff = max_difference(ours, pil);
      ASSERT_GE(diff, 0) << name << " as " << mode << ": " << shape(ours) << " against PIL's " << shape(pil);
      if (ext == ".png")
        EXPECT_EQ(diff, 0) << name << " as " << mode;
      else
        EXPECT_LE(diff, 1) << name << " as " << mode;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 12 * 3);
}

TEST_F(ImageReference, TransformsEqualTorchvisionsOnPilImages) {
  std::ifstream cases(dir() / "transforms.txt");
  const char* variant = std::getenv("KILN_TEST_VARIANT");
  int run = 0;
  for (std::string line; std::getline(cases, line);) {
    std::istringstream in(line);
    std::string image, mode, op, word;
    in >> image >> mode >> op;
    std::vector<int> args;
    while (in >> word && word != "->") args.push_back(std::stoi(word));
    std::string expected_file;
    in >> expected_file;
    // The input is PIL's own decode, so only the transform is compared.
    const Image input = read_npy(dir() / (image + "." + mode + ".npy"));
    Image ours;
    if (op == "resize") {
      const kiln_image::Size s = kiln_image::resize_target(args, input.width, input.height);
      ours = kiln_image::resize_bilinear(input, s.width, s.height);
    } else if (op == "center_crop") {
      ours = kiln_image::center_crop(input, {args[0], args[1]});
    } else if (op == "hflip") {
      ours = kiln_image::horizontal_flip(input);
    } else if (op == "resized_crop") {
      ours = kiln_image::resize_bilinear(kiln_image::crop(input, args[0], args[1], args[2], args[3]), args[5], args[4]);
    } else {
      FAIL() << "unknown case: " << line;
    }
    const Image expected = read_npy(dir() / expected_file);
    EXPECT_EQ(max_difference(ours, expected), 0)
        << line << ": ours " << shape(ours) << ", torchvision's " << shape(expected);
    ++run;
  }
  // torchvision comes with Debian's python3-torchvision (./go installs it);
  // the wheel's Python has none, and there only the decoders are checked.
  if (run == 0 && !(variant && std::string(variant) == "debian"))
    GTEST_SKIP() << "no torchvision in the checking Python: transforms not compared";
  EXPECT_GT(run, 100);
}

TEST_F(ImageReference, DamagedFilesAreRefusedWithOneLineNamingTheFile) {
  for (const std::string name : {"truncated.png", "truncated.jpg", "text.jpg", "empty.png"}) {
    try {
      (void)kiln_image::decode_image(read_file(dir() / name), "cats/" + name, 3);
      ADD_FAILURE() << name << " was decoded";
    } catch (const kiln_image::ImageError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("'cats/" + name + "': ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(ImageTransforms, RandomResizedCropDrawsOnlyFromItsSampleSeed) {
  kiln_image::SampleRandom a(42), b(42), c(43);
  const auto box_a = kiln_image::random_resized_crop_box(500, 375, {0.08, 1.0}, {0.75, 4.0 / 3}, a);
  const auto box_b = kiln_image::random_resized_crop_box(500, 375, {0.08, 1.0}, {0.75, 4.0 / 3}, b);
  const auto box_c = kiln_image::random_resized_crop_box(500, 375, {0.08, 1.0}, {0.75, 4.0 / 3}, c);
  EXPECT_EQ(std::tie(box_a.top, box_a.left, box_a.height, box_a.width),
            std::tie(box_b.top, box_b.left, box_b.height, box_b.width));
  EXPECT_NE(std::tie(box_a.top, box_a.left, box_a.height, box_a.width),
            std::tie(box_c.top, box_c.left, box_c.height, box_c.width));
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    kiln_image::SampleRandom r(seed);
    const auto box = kiln_image::random_resized_crop_box(500, 375, {0.08, 1.0}, {0.75, 4.0 / 3}, r);
    ASSERT_GE(box.top, 0);
    ASSERT_GE(box.left, 0);
    ASSERT_LE(box.top + box.height, 375);
    ASSERT_LE(box.left + box.width, 500);
    const double area = static_cast<double>(box.height) * box.width / (500.0 * 375.0);
    ASSERT_GE(area, 0.07) << seed;
  }
}

}  // namespace
}  // namespace kiln::test
