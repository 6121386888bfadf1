// kiln_image_folder (plugins/image_folder) and examples/own_data: each
// format's manifest trains to its stated accuracy; predict names each test
// image and its class; random transforms give the same batches with 1, 2
// or 4 data workers, 1 or 2 processes and after a mid-epoch resume; a
// damaged image stops the run naming it, or with skip_unreadable is
// replaced, counted and logged; and bad folders and transforms are one
// line, exit 2, nothing written.
#include <gtest/gtest.h>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(600);

// examples/own_data/make_data.py into dir/data.
void make_own_data(const TempDir& dir) {
  const ProcessResult r = run_process({check_python().string(),
                                       (source_dir() / "examples" / "own_data" / "make_data.py").string(),
                                       (dir / "data").string()},
                                      {.timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// `kiln <args>` run in `cwd`, where the example manifests' data paths lead.
ProcessResult kiln_in(const std::filesystem::path& cwd, const std::vector<std::string>& args) {
  return kiln(args, {.cwd = cwd, .timeout = kTimeout});
}

std::filesystem::path example(const std::string& name) { return source_dir() / "examples" / "own_data" / name; }

struct OwnDataCase {
  const char* manifest;
  double accuracy;  // the test accuracy the manifest reaches, at least
};

void PrintTo(const OwnDataCase& c, std::ostream* os) { *os << c.manifest; }

class OwnData : public testing::TestWithParam<OwnDataCase> {};

// Each manifest of examples/own_data swaps only [data]; each trains to its
// stated test accuracy (docs/data.md, README "Your own data"), and `kiln
// inspect` shows the splits.
TEST_P(OwnData, EachFormatTrainsToItsStatedAccuracy) {
  KILN_ONLY_IN_VARIANT("debian");
  KILN_REQUIRE_CHECK_PYTHON();
  const OwnDataCase& c = GetParam();
  TempDir dir;
  make_own_data(dir);
  const std::string run = (dir / "run").string();
  const ProcessResult fit = kiln_in(dir.path(), {"fit", example(c.manifest).string(), "--set", "run.dir=" + run,
                                                 "--set", "trainer.progress=none"});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");
  EXPECT_GE(last_value(rows, "test/acc"), c.accuracy) << fit.output;
  const ProcessResult inspect = kiln_in(dir.path(), {"inspect", example(c.manifest).string(), "--set", "run.dir=" + run});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("train"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("input"), std::string::npos) << inspect.output;
}

INSTANTIATE_TEST_SUITE_P(Examples, OwnData,
                         testing::Values(OwnDataCase{"npy.toml", 0.95}, OwnDataCase{"safetensors.toml", 0.95},
                                         OwnDataCase{"csv.toml", 0.95}, OwnDataCase{"images.toml", 0.90}),
                         [](const testing::TestParamInfo<OwnDataCase>& info) {
                           std::string name = info.param.manifest;
                           return name.substr(0, name.find('.'));
                         });

// The README's "Your own data" commands, as a user types them on the
// machine `./go example` set up: its sh block, run line by line from the top
// of a copy of the checkout (examples/own_data and build/bin/kiln), with a
// `python3` that sees Python's standard library alone (-I -S: no NumPy,
// Pillow or safetensors from any site-packages). Each command must succeed.
TEST(Readme, OwnDataCommandsRunAsTypedWithPythonsStandardLibraryAlone) {
  KILN_ONLY_IN_VARIANT("debian");
  const std::string readme = read_file(source_dir() / "README.md");
  const size_t section = readme.find("\n## Your own data");
  ASSERT_NE(section, std::string::npos) << "README.md has no 'Your own data' section";
  const size_t begin = readme.find("```sh\n", section);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = readme.find("```", begin + 6);
  const std::string block = readme.substr(begin + 6, end - begin - 6);
  ASSERT_NE(block.find("python3 make_data.py"), std::string::npos) << block;

  TempDir top;
  std::filesystem::create_directories(top / "examples" / "own_data");
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "examples" / "own_data"))
    if (entry.is_regular_file()) std::filesystem::copy_file(entry.path(), top / "examples" / "own_data" / entry.path().filename());
  std::filesystem::create_directories(top / "build" / "bin");
  std::filesystem::create_symlink(kiln_exe(), top / "build" / "bin" / "kiln");
  // The python3 a user's PATH finds, without any site-packages.
  const ProcessResult which = run_process({"/bin/sh", "-c", "command -v python3"});
  ASSERT_EQ(which.exit_code, 0) << "no python3 on PATH: " << which.output;
  const std::string python = which.output.substr(0, which.output.find('\n'));
  std::filesystem::create_directories(top / "shim");
  write_file(top / "shim" / "python3", "#!/bin/sh\nexec \"" + python + "\" -I -S \"$@\"\n");
  std::filesystem::permissions(top / "shim" / "python3", std::filesystem::perms::owner_all);
  const char* path = std::getenv("PATH");
  const ProcessResult r =
      run_process({"/bin/sh", "-e", "-x", "-c", block},
                  {.cwd = top.path(),
                   .env = {{"PATH", (top / "shim").string() + ":" + (path ? path : "/usr/bin:/bin")}},
                   .timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("no safetensors package"), std::string::npos) << r.output;
  // What the block's last command writes: each test image named.
  bool predicted = false;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(top / "examples" / "own_data" / "runs"))
    predicted = predicted || entry.path().filename() == "predictions.csv";
  EXPECT_TRUE(predicted) << r.output;
}

// predictions.csv names each test image and its class, by the class list
// in the run directory; the classes are the folders, sorted.
TEST(ImageFolder, PredictNamesEachImageAndItsClass) {
  KILN_ONLY_IN_VARIANT("debian");
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  make_own_data(dir);
  const std::string run = (dir / "run").string();
  ASSERT_EQ(kiln_in(dir.path(), {"fit", example("images.toml").string(), "--set", "run.dir=" + run, "--set",
                                 "trainer.max_epochs=6", "--set", "trainer.progress=none"})
                .exit_code,
            0);
  EXPECT_EQ(read_file(dir / "run" / "kiln.image_folder" / "classes.json"), "[\"circle\", \"square\", \"triangle\"]\n");
  const ProcessResult r = kiln_in(dir.path(), {"predict", example("images.toml").string(), "--ckpt", "last", "--set",
                                               "run.dir=" + run});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream table(read_file(dir / "run" / "predictions.csv"));
  std::string line;
  std::getline(table, line);
  EXPECT_EQ(line, "index,name,prediction,class");
  int rows = 0, right = 0;
  while (std::getline(table, line)) {
    // "7,circle/circle_007.png,0,circle": the image's folder is its class.
    std::vector<std::string> cells;
    std::istringstream in(line);
    for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
    ASSERT_EQ(cells.size(), 4u) << line;
    EXPECT_EQ(cells[0], std::to_string(rows));
    right += cells[1].substr(0, cells[1].find('/')) == cells[3];
    ++rows;
  }
  EXPECT_EQ(rows, 120);
  EXPECT_GE(right, 100) << "of 120 test images named with their class";
}

// Random crops and flips are a pure function of (seed, epoch, sample): the
// rows each sample's input hashes to are the same bytes with 1, 2 or 4
// data workers, with 1 or 2 processes, and after a mid-epoch resume; and
// they differ from epoch to epoch.
TEST(ImageFolder, AugmentedBatchesAreTheSameWithAnyWorkersOrProcessesAndAfterAResume) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir data;
  make_own_data(data);
  const auto manifest = [&](const TempDir& dir) {
    write_file(dir / "run.toml",
               "[run]\ndir = \"" + (dir / "run").string() + "\"\nseed = 5\nthreads = 1\n\n[model]\npath = \"" +
                   (test_plugin_dir() / "libkiln_test_collect_probe.so").string() +
                   "\"\nid = \"kiln.test.input_hash\"\n\n[data]\npath = \"kiln_image_folder\"\ntrain = \"" +
                   (data / "data" / "images" / "test").string() +
                   "\"\ntransforms = [{ name = \"random_resized_crop\", size = 16 }, { name = \"horizontal_flip\" },"
                   " { name = \"normalize\", mean = [0.5, 0.5, 0.5], std = [0.2, 0.2, 0.2] }]\n"
                   "eval_transforms = [{ name = \"center_crop\", size = 16 }]\n\n[[callbacks]]\npath = \"" +
                   (test_plugin_dir() / "libkiln_test_collect_probe.so").string() +
                   "\"\nid = \"kiln.test.collect_dump\"\ndir = \"" + dir.path().string() +
                   "\"\n\n[trainer]\nmax_epochs = 2\nbatch_size = 8\nprogress = \"none\"\n\n[checkpoint]\nevery_n_steps = 1\n");
    return dir / "run.toml";
  };
  const auto dumps = [](const TempDir& dir) { return read_file(dir / "train-0.txt") + read_file(dir / "train-1.txt"); };
  TempDir one;
  ProcessResult r = kiln_fit(manifest(one), {"--set", "trainer.data_workers=1"}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string expected = dumps(one);
  ASSERT_NE(expected.find("input_hash 2\n"), std::string::npos) << expected.substr(0, 400);
  EXPECT_NE(read_file(one / "train-0.txt"), read_file(one / "train-1.txt")) << "epoch 1 draws other crops";
  for (const auto& [what, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"2 workers", {"--set", "trainer.data_workers=2"}},
           {"4 workers", {"--set", "trainer.data_workers=4"}},
           {"inline", {"--set", "trainer.data_workers=0"}},
           {"2 processes", {"-n", "2", "--set", "trainer.data_workers=2"}}}) {
    TempDir other;
    r = kiln_fit(manifest(other), args, kTimeout);
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
    EXPECT_TRUE(dumps(other) == expected) << what << ": the batches differ";
  }
  TempDir resumed;
  r = kiln_fit(manifest(resumed), {"--set", "trainer.max_steps=5", "--set", "trainer.data_workers=3"}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = kiln_fit(resumed / "run.toml", {"--resume", "last", "--set", "trainer.data_workers=2"}, kTimeout);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(dumps(resumed) == expected) << "after a resume at step 5: the batches differ";
}

// A folder with one damaged JPEG: the run stops naming it (exit 1), or with
// skip_unreadable = true it is replaced, named once and counted per epoch.
TEST(ImageFolderDamaged, StopsTheRunNamingItOrIsSkippedAndCounted) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  make_own_data(dir);
  const auto bad = dir / "data" / "images" / "train" / "square" / "square_004.jpg";
  const std::string bytes = read_file(bad);
  write_file(bad, bytes.substr(0, bytes.size() / 2));
  const std::string run = (dir / "run").string();
  const std::vector<std::string> args{"fit", example("images.toml").string(), "--set", "run.dir=" + run, "--set",
                                      "trainer.max_epochs=2", "--set", "trainer.progress=none"};
  ProcessResult r = kiln_in(dir.path(), args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("square/square_004.jpg': not a readable JPEG"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("skip_unreadable = true"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir / "run");
  std::vector<std::string> skip = args;
  skip.insert(skip.end(), {"--set", "data.skip_unreadable=true"});
  r = kiln_in(dir.path(), skip);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipped: '"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unreadable image replaced by the next readable one in epoch 0"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("in epoch 1 (skip_unreadable)"), std::string::npos) << r.output;
}

struct Refusal {
  const char* name;
  std::string data;  // the [data] table's keys after path
  const char* expected;
};

void PrintTo(const Refusal& c, std::ostream* os) { *os << c.name; }

class ImageFolderRefuse : public testing::TestWithParam<Refusal> {};

// Each bad folder or transform: one line naming it, exit 2, nothing written.
TEST_P(ImageFolderRefuse, EachBadFolderOrTransformWithOneLineExit2AndNothingWritten) {
  KILN_REQUIRE_CHECK_PYTHON();
  const Refusal& c = GetParam();
  TempDir dir;
  make_own_data(dir);
  std::filesystem::create_directories(dir / "data" / "images" / "empty_class" / "a");
  std::filesystem::create_directories(dir / "data" / "images" / "stray" / "hexagon");
  write_file(dir / "data" / "images" / "stray" / "hexagon" / "h.png", read_file(dir / "data" / "images" / "test" / "circle" / "circle_002.png"));
  std::filesystem::create_directories(dir / "data" / "images" / "empty_class" / "b");
  write_file(dir / "data" / "images" / "empty_class" / "b" / "notes.txt", "not an image\n");
  write_file(dir / "run.toml", "[run]\ndir = \"" + (dir / "run").string() +
                                   "\"\n\n[model]\npath = \"kiln_cnn\"\nin_channels = 3\nimage_size = 32\nclasses = 3\n\n"
                                   "[data]\npath = \"kiln_image_folder\"\n" + c.data +
                                   "\n[trainer]\nmax_epochs = 1\nprogress = \"none\"\n");
  const auto before = snapshot(dir.path());
  const ProcessResult r = kiln_in(dir.path(), {"fit", (dir / "run.toml").string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.expected << "\n" << r.output;
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
  EXPECT_TRUE(snapshot(dir.path()) == before) << "something was written";
}

INSTANTIATE_TEST_SUITE_P(
    ImageFolder, ImageFolderRefuse,
    testing::Values(
        Refusal{"NoSuchFolder", "train = \"data/images/nope\"\n", "'data/images/nope': no such directory"},
        Refusal{"ClassWithoutImages", "train = \"data/images/empty_class\"\n",
                "class 'a' has no .jpg, .jpeg or .png file"},
        Refusal{"ValClassNotInTrain", "train = \"data/images/train\"\nval = \"data/images/stray\"\n",
                "class 'hexagon' is not one of train's classes"},
        Refusal{"UnknownTransform", "train = \"data/images/train\"\ntransforms = [{ name = \"rotate\" }]\n",
                "unknown transform 'rotate'"},
        Refusal{"NormalizeOfTheWrongWidth",
                "train = \"data/images/train\"\ntransforms = [{ name = \"normalize\", mean = [0.5], std = [0.2] }]\n",
                "'mean' and 'std' have one value per channel (3"},
        Refusal{"RandomWithoutEvalTransforms",
                "train = \"data/images/train\"\ntransforms = [{ name = \"random_resized_crop\", size = 32 }]\n",
                "give 'eval_transforms' for val, test and predict"},
        Refusal{"TwoChannels", "train = \"data/images/train\"\nchannels = 2\n", "'channels' is 1 (greyscale), 3"},
        Refusal{"ATransformKeyTypo",
                "train = \"data/images/train\"\ntransforms = [{ name = \"center_crop\", size = 8, sise = 3 }]\n",
                "'transforms[0]': unknown key 'sise'"}),
    [](const testing::TestParamInfo<Refusal>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kiln::test
