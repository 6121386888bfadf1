// kiln.image_folder — torchvision's ImageFolder: root/<class>/<image>, JPEG
// and PNG, with torchvision's transforms named in the manifest. The batch
// is "input" float32 [N, C, H, W] and "target" int64 class indices.
//
// [data]
// path = "kiln_image_folder"
// train = "images/train"        # root/<class>/<files>; classes sorted by name
// val = "images/val"            # optional, read with train's classes; or
// val_fraction = 0.1            # held out of train: a permutation seeded by `seed`
// test = "images/test"          # optional; also the predict split
// channels = 3                  # 1 (L), 3 (RGB) or 4 (RGBA), as PIL's convert
// transforms = [                # train's, in order (image_transforms.hpp)
//   { name = "random_resized_crop", size = 224 },
//   { name = "horizontal_flip" },
//   { name = "normalize", mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225] },
// ]
// eval_transforms = [...]       # val, test and predict; default: `transforms`, which
//                               # must then draw nothing at random
// skip_unreadable = false       # true: a damaged image is replaced, counted and logged
// seed = 0
//
// Random transforms draw from the host's per-sample seed (ABI 1.4,
// get_batch_seeded): the same crops and flips with any number of data
// workers or processes, and after a resume. The classes are written to
// <run dir>/kiln.image_folder/classes.json and the test (= predict) split's
// files to predict_names.txt (one path per line, in sample order): `kiln
// predict` names its rows and their classes with them (predictions.csv).
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "folder.hpp"
#include "image_decode.hpp"
#include "image_transforms.hpp"
#include "kiln/plugin.hpp"
#include "kiln_plugins/by_split.hpp"
#include "kiln_plugins/class_list.hpp"
#include "kiln_plugins/held_out.hpp"
#include "kiln_plugins/one_line.hpp"

namespace {

constexpr const char* kId = "kiln.image_folder";

using kiln_image::Transform;

struct Split {
  std::filesystem::path root;
  std::vector<kiln_image::FolderSample> samples;  // all the folder's
  std::vector<int64_t> rows;                      // the split's rows of `samples` (a held-out subset), or empty: all
  int64_t length = 0;
  const kiln_image::FolderSample& at(int64_t i) const { return samples[static_cast<size_t>(rows.empty() ? i : rows[i])]; }
};

std::vector<int> sizes(kiln::Config& t, const std::string& where) {
  std::vector<int> size;
  if (t.has("size")) {
    const toml::node* node = t.table().get("size");
    if (node->is_integer()) {
      size = {t.get<int>("size", 0)};
    } else {
      size = t.get_list<int>("size", {});
    }
  } else {
    (void)t.get<int>("size", 0);
    throw kiln::ConfigError(where + ": 'size' is required (an integer or [height, width])");
  }
  if (size.empty() || size.size() > 2) throw kiln::ConfigError(where + ": 'size' is an integer or [height, width]");
  for (const int s : size)
    if (s < 1 || s > 16384) throw kiln::ConfigError(where + ": 'size' values are between 1 and 16384");
  return size;
}

std::array<double, 2> range(kiln::Config& t, const std::string& key, std::array<double, 2> fallback,
                            const std::string& where) {
  const std::vector<double> v = t.get_list<double>(key, {fallback[0], fallback[1]});
  if (v.size() != 2 || !(v[0] > 0) || !(v[0] <= v[1]))
    throw kiln::ConfigError(where + ": '" + key + "' is [low, high] with 0 < low <= high");
  return {v[0], v[1]};
}

std::vector<Transform> parse_transforms(kiln::Config& config, const std::string& key, int channels) {
  std::vector<Transform> out;
  std::vector<kiln::Config> tables = config.get_table_list(key);
  for (size_t i = 0; i < tables.size(); ++i) {
    kiln::Config& t = tables[i];
    const std::string where = "'" + key + "[" + std::to_string(i) + "]'";
    const std::string name = t.get<std::string>("name", "");
    Transform tr{};
    if (name == "resize") {
      tr.kind = Transform::Kind::resize;
      tr.size = sizes(t, where);
      const std::string interpolation = t.get<std::string>("interpolation", "bilinear");
      if (interpolation != "bilinear")
        throw kiln::ConfigError(where + ": interpolation \"" + interpolation + "\" is not supported; \"bilinear\" is (torchvision's default)");
      if (!t.get<bool>("antialias", true))
        throw kiln::ConfigError(where + ": antialias = false is not supported (torchvision's default is true)");
    } else if (name == "center_crop") {
      tr.kind = Transform::Kind::center_crop;
      tr.size = sizes(t, where);
    } else if (name == "random_resized_crop") {
      tr.kind = Transform::Kind::random_resized_crop;
      tr.size = sizes(t, where);
      tr.scale = range(t, "scale", {0.08, 1.0}, where);
      tr.ratio = range(t, "ratio", {3.0 / 4.0, 4.0 / 3.0}, where);
      if (tr.scale[1] > 1.0) throw kiln::ConfigError(where + ": 'scale' is at most 1");
    } else if (name == "horizontal_flip") {
      tr.kind = Transform::Kind::horizontal_flip;
      tr.p = t.get<double>("p", 0.5);
      if (!(tr.p >= 0.0 && tr.p <= 1.0)) throw kiln::ConfigError(where + ": 'p' is between 0 and 1");
    } else if (name == "normalize") {
      tr.kind = Transform::Kind::normalize;
      const std::vector<double> mean = t.get_list<double>("mean", {}), std = t.get_list<double>("std", {});
      if (mean.size() != static_cast<size_t>(channels) || std.size() != static_cast<size_t>(channels))
        throw kiln::ConfigError(where + ": 'mean' and 'std' have one value per channel (" + std::to_string(channels) +
                                ", from 'channels')");
      for (size_t c = 0; c < mean.size(); ++c) {
        if (!(std[c] > 0)) throw kiln::ConfigError(where + ": 'std' values are > 0");
        tr.mean.push_back(static_cast<float>(mean[c]));
        tr.std.push_back(static_cast<float>(std[c]));
      }
      if (i + 1 != tables.size()) throw kiln::ConfigError(where + ": normalize comes last (it works on the float tensor)");
    } else {
      throw kiln::ConfigError(where + ": unknown transform '" + name +
                              "'; kiln_image_folder has resize, center_crop, random_resized_crop, horizontal_flip, normalize");
    }
    const std::vector<std::string> unread = t.unread_keys();
    if (!unread.empty()) throw kiln::ConfigError(where + ": unknown key " + unread.front());
    out.push_back(tr);
  }
  return out;
}

bool draws_at_random(const std::vector<Transform>& transforms) {
  for (const Transform& t : transforms)
    if (t.kind == Transform::Kind::random_resized_crop || (t.kind == Transform::Kind::horizontal_flip && t.p > 0))
      return true;
  return false;
}

std::string read_bytes(const std::filesystem::path& file, const std::string& shown) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw kiln_image::ImageError("'" + shown + "': cannot be opened");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw kiln_image::ImageError("'" + shown + "': cannot be read");
  return bytes.str();
}

class ImageFolder final : public kiln::DataModule {
 public:
  ImageFolder(const kiln::Host& host, kiln::Config& config) : DataModule(host) {
    train_dir_ = config.require<std::string>("train");
    val_dir_ = config.get<std::string>("val", "");
    test_dir_ = config.get<std::string>("test", "");
    channels_ = config.get<int>("channels", 3);
    if (channels_ != 1 && channels_ != 3 && channels_ != 4)
      throw kiln::ConfigError("'channels' is 1 (greyscale), 3 (RGB) or 4 (RGBA), got " + std::to_string(channels_));
    transforms_ = parse_transforms(config, "transforms", channels_);
    if (config.has("eval_transforms")) {
      eval_transforms_ = parse_transforms(config, "eval_transforms", channels_);
    } else {
      (void)config.get_table_list("eval_transforms");
      if (draws_at_random(transforms_))
        throw kiln::ConfigError(
            "'transforms' draws at random (random_resized_crop, horizontal_flip): give 'eval_transforms' for val, test "
            "and predict too, e.g. [{ name = \"resize\", size = 256 }, { name = \"center_crop\", size = 224 }]");
      eval_transforms_ = transforms_;
    }
    skip_unreadable_ = config.get<bool>("skip_unreadable", false);
    val_fraction_ = config.get<double>("val_fraction", 0.0);
    seed_ = static_cast<uint64_t>(config.get<int64_t>("seed", 0));
    if (!(val_fraction_ >= 0.0 && val_fraction_ < 1.0))
      throw kiln::ConfigError("'val_fraction' must be in [0, 1), got " + std::to_string(val_fraction_));
    if (val_fraction_ > 0.0 && !val_dir_.empty())
      throw kiln::ConfigError("'val' and 'val_fraction' both name a validation split; keep one");
  }

  void setup(kiln::Stage) override {
    try {
      const kiln_image::Folder train = kiln_image::list_folder(train_dir_);
      classes_ = train.classes;
      note_other_files("train", train);
      train_ = split_of(train);
      if (!val_dir_.empty()) {
        const kiln_image::Folder val = kiln_image::list_folder(val_dir_, &classes_);
        note_other_files("val", val);
        val_ = split_of(val);
      }
      if (!test_dir_.empty()) {
        const kiln_image::Folder test = kiln_image::list_folder(test_dir_, &classes_);
        note_other_files("test", test);
        test_ = split_of(test);
      }
    } catch (const kiln_image::FolderError& e) {
      throw kiln::InvalidInput(e.what());
    }
    if (val_fraction_ > 0.0) {
      const kiln_plugins::HeldOut held = kiln_plugins::hold_out(train_.length, val_fraction_, seed_);
      kiln_plugins::record_held_out(host(), kId, held, val_fraction_, seed_);
      val_ = train_;
      val_.rows = std::vector<int64_t>(held.val_rows.data_ptr<int64_t>(), held.val_rows.data_ptr<int64_t>() + held.val_rows.numel());
      val_.length = static_cast<int64_t>(val_.rows.size());
      train_.rows = std::vector<int64_t>(held.train_rows.data_ptr<int64_t>(),
                                         held.train_rows.data_ptr<int64_t>() + held.train_rows.numel());
      train_.length = static_cast<int64_t>(train_.rows.size());
    }
    save_run_files();
  }

  void teardown(kiln::Stage, bool) override {
    report_skipped(-1);
    train_ = val_ = test_ = Split{};
  }

  int64_t length(kiln::Split split) override { return select(split).length; }

  // Each sample is decoded and transformed on its own: safe to call from
  // several worker threads at once (KILN_DATA_CONCURRENT_GET_BATCH).
  kiln::TensorMap get_batch_seeded(const kiln::BatchRequest& request) override {
    const Split& data = select(request.split);
    const std::vector<Transform>& transforms = request.split == kiln::Split::train ? transforms_ : eval_transforms_;
    // The batch check's sample (ABI 1.5) is no epoch's: it is neither
    // counted nor named, and starts no epoch's report (docs/abi.md).
    if (request.split == kiln::Split::train && !request.for_check) report_skipped(request.epoch);
    at::Tensor input, target = torch::empty({static_cast<int64_t>(request.count)}, torch::kLong);
    int height = 0, width = 0;
    std::string first_name;
    for (size_t i = 0; i < request.count; ++i) {
      const int64_t index = request.indices[i];
      if (index < 0 || index >= data.length)
        throw std::out_of_range("sample index " + std::to_string(index) + " outside the split's " +
                                std::to_string(data.length));
      int64_t label = 0;
      std::string name;
      const kiln_image::Image image =
          load(data, index, request.split, request.seed(i), transforms, request.for_check, &label, &name);
      if (i == 0) {
        height = image.height;
        width = image.width;
        first_name = name;
        input = torch::empty({static_cast<int64_t>(request.count), channels_, height, width}, torch::kFloat);
      } else if (image.height != height || image.width != width) {
        throw kiln::InvalidInput("images of one batch differ in size after the transforms ('" + first_name + "' " +
                                 std::to_string(width) + "x" + std::to_string(height) + ", '" + name + "' " +
                                 std::to_string(image.width) + "x" + std::to_string(image.height) +
                                 "); end the transforms with center_crop, random_resized_crop or a resize to [h, w]");
      }
      kiln_image::to_chw_float(image, transforms, input[static_cast<int64_t>(i)].data_ptr<float>());
      target[static_cast<int64_t>(i)] = label;
    }
    return {{"input", input}, {"target", target}};
  }

 private:
  Split split_of(const kiln_image::Folder& folder) const {
    Split s;
    s.root = folder.root;
    s.samples = folder.samples;
    s.length = static_cast<int64_t>(s.samples.size());
    return s;
  }

  void note_other_files(const std::string& split, const kiln_image::Folder& folder) const {
    if (folder.other_files > 0)
      host().info(split + ": " + std::to_string(folder.other_files) + " file" + (folder.other_files == 1 ? "" : "s") +
                  " left out, not .jpg, .jpeg or .png (e.g. '" + kiln_plugins::one_line(folder.an_other_file) + "')");
  }

  // The image of sample `index`, transformed. An unreadable one stops the
  // run, or with skip_unreadable is replaced by the split's next readable
  // image (so the batch keeps its size and every other sample its place),
  // counted, and named once in the log.
  kiln_image::Image load(const Split& data, int64_t index, kiln::Split split, uint64_t seed,
                         const std::vector<Transform>& transforms, bool for_check, int64_t* label, std::string* name) {
    for (int64_t tries = 0; tries < data.length; ++tries) {
      const kiln_image::FolderSample& sample = data.at((index + tries) % data.length);
      try {
        const std::string shown = kiln_plugins::one_line((data.root / sample.path).string());
        kiln_image::Image image = kiln_image::decode_image(read_bytes(data.root / sample.path, shown), shown, channels_);
        kiln_image::SampleRandom random(seed);
        *label = sample.label;
        *name = sample.path;
        return kiln_image::apply_geometry(std::move(image), transforms, random);
      } catch (const kiln_image::ImageError& e) {
        if (!skip_unreadable_)
          throw std::runtime_error(std::string(e.what()) + " (skip_unreadable = true skips such files)");
        if (!for_check) note_unreadable(split, data.root / sample.path, e.what());
      }
    }
    throw std::runtime_error("no image of the split '" + data.root.string() + "' could be read");
  }

  void note_unreadable(kiln::Split split, const std::filesystem::path& file, const std::string& why) {
    std::lock_guard<std::mutex> lock(skipped_mutex_);
    ++skipped_[split];
    if (named_.insert(file.string()).second) host().warn("skipped: " + why);
  }

  // At the first batch of a new training epoch (and at teardown, -1): how
  // many images the epoch before skipped, per split.
  void report_skipped(int64_t epoch) {
    std::lock_guard<std::mutex> lock(skipped_mutex_);
    if (epoch >= 0 && epoch == epoch_) return;
    for (const auto& [split, count] : skipped_) {
      if (count == 0) continue;
      static const char* kNames[] = {"", "train", "val", "test", "predict"};
      host().warn(std::string(kNames[static_cast<int>(split)]) + ": " + std::to_string(count) + " unreadable image" +
                  (count == 1 ? "" : "s") + " replaced by the next readable one" +
                  (epoch_ >= 0 ? " in epoch " + std::to_string(epoch_) : "") + " (skip_unreadable)");
    }
    skipped_.clear();
    epoch_ = epoch;
  }

  void save_run_files() const {
    const bool saved = kiln_plugins::save_class_list(host(), classes_);
    // The predict split's images, which `kiln predict` names its rows with
    // (train/prediction_table.hpp in the host).
    if (test_.length > 0) {
      std::string files;
      for (int64_t i = 0; i < test_.length; ++i) files += test_.at(i).path + "\n";
      host().write_run_file("predict_names.txt", files);
    }
    std::string shown;
    for (size_t i = 0; i < std::min<size_t>(classes_.size(), 10); ++i) shown += (i ? ", " : "") + classes_[i];
    host().info(std::to_string(classes_.size()) + " classes, " + std::to_string(train_.length) + " training images" +
                (saved ? " (<run dir>/" + std::string(kId) + "/classes.json)" : "") + ": " +
                kiln_plugins::one_line(shown) + (classes_.size() > 10 ? ", ..." : ""));
  }

  const Split& select(kiln::Split split) const { return kiln_plugins::by_split(split, train_, val_, test_); }

  std::string train_dir_, val_dir_, test_dir_;
  int channels_ = 3;
  std::vector<Transform> transforms_, eval_transforms_;
  bool skip_unreadable_ = false;
  double val_fraction_ = 0.0;
  uint64_t seed_ = 0;
  std::vector<std::string> classes_;
  Split train_, val_, test_;
  std::mutex skipped_mutex_;
  std::map<kiln::Split, int64_t> skipped_;
  std::set<std::string> named_;
  int64_t epoch_ = -1;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<ImageFolder>({kId, "Image folders", "0.1.0",
                                                 "torchvision's ImageFolder: JPEG and PNG in one folder per class",
                                                 KILN_DATA_CONCURRENT_GET_BATCH}))
