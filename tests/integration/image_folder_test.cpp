// kiln_image_folder (plugins/image_folder) and examples/own_data: each
// format's manifest trains to its stated accuracy; predict names each test
// image and its class; random transforms give the same batches with 1, 2
// or 4 data workers, 1 or 2 processes and after a mid-epoch resume; a
// damaged image stops the run naming it, or with skip_unreadable is
// replaced, counted and logged; and bad folders and transforms are one
// line, exit 2, nothing written.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "common.hpp"
#include "docs_table.hpp"

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
    const std::string probe = (test_plugin_dir() / "libkiln_test_collect_probe.so").string();
    return write_run_manifest(
        dir, {.name = "",
              .run = "seed = 5\nthreads = 1\n",
              .model = "path = \"" + probe + "\"\nid = \"kiln.test.input_hash\"\n",
              .data = "path = \"kiln_image_folder\"\ntrain = \"" + (data / "data" / "images" / "test").string() +
                      "\"\ntransforms = [{ name = \"random_resized_crop\", size = 16 }, { name = \"horizontal_flip\" },"
                      " { name = \"normalize\", mean = [0.5, 0.5, 0.5], std = [0.2, 0.2, 0.2] }]\n"
                      "eval_transforms = [{ name = \"center_crop\", size = 16 }]\n",
              .trainer = trainer_keys(2, 8),
              .optimizer = "",
              .extra = "\n[[callbacks]]\npath = \"" + probe + "\"\nid = \"kiln.test.collect_dump\"\ndir = \"" +
                       dir.path().string() + "\"\n\n[checkpoint]\nevery_n_steps = 1\n"});
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

// Each kind of damaged image stops the run naming it (exit 1) with a line
// docs/data.md's table of damaged images quotes for it; with skip_unreadable
// = true a damaged JPEG is replaced, named once and counted per epoch, in
// the lines that table quotes. Every row of the table, and every line a row
// quotes, is some case's (a row added without a case fails here).
TEST(ImageFolderDamaged, StopsTheRunNamingItOrIsSkippedAndCounted) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  make_own_data(dir);
  const std::vector<DocsRow> table = docs_table("## `kiln_image_folder`", "| a damaged image | the line says |");
  ASSERT_GE(table.size(), 5u) << "docs/data.md's table of damaged images, under ## `kiln_image_folder`";
  std::set<std::pair<std::string, int>> seen;
  const auto square = dir / "data" / "images" / "train" / "square";
  const auto halve = [](const std::filesystem::path& file) {
    const std::string bytes = read_file(file);
    write_file(file, bytes.substr(0, bytes.size() / 2));
  };
  struct Damage {
    std::string file;  // under data/images/train
    std::function<void(const std::filesystem::path&)> damage;
    std::string docs_row;
  };
  const std::string truncated = "a truncated JPEG or PNG";
  const std::string not_an_image = "a file that is neither a JPEG nor a PNG, or is empty";
  const std::vector<Damage> damages{
      {"square/square_004.jpg", halve, truncated},
      {"square/square_002.png", halve, truncated},
      {"square/square_005.png", [](const auto& file) { write_file(file, "not an image\n"); }, not_an_image},
      {"square/square_003.jpg", [](const auto& file) { write_file(file, ""); }, not_an_image},
      {"square/zz_dangling.png",
       [&](const auto& file) { std::filesystem::create_symlink(dir / "no_such_file.png", file); },
       "a file that cannot be opened (a dangling link)"}};
  const std::string run = (dir / "run").string();
  const std::vector<std::string> args{"fit", example("images.toml").string(), "--set", "run.dir=" + run, "--set",
                                      "trainer.max_epochs=2", "--set", "trainer.progress=none"};
  for (const auto& d : damages) {
    SCOPED_TRACE(d.file);
    const auto file = dir / "data" / "images" / "train" / d.file;
    const bool existed = std::filesystem::exists(file);
    const std::string bytes = existed ? read_file(file) : "";
    d.damage(file);
    const ProcessResult r = kiln_in(dir.path(), args);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    seen.insert({d.docs_row, expect_docs_quote(table, d.docs_row, r.output)});
    EXPECT_NE(r.output.find(d.file + "': "), std::string::npos) << "names the file\n" << r.output;
    EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
    std::filesystem::remove_all(dir / "run");
    std::filesystem::remove(file);
    if (existed) write_file(file, bytes);
  }
  halve(square / "square_004.jpg");
  std::vector<std::string> skip = args;
  skip.insert(skip.end(), {"--set", "data.skip_unreadable=true"});
  const ProcessResult r = kiln_in(dir.path(), skip);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string row : {"with `skip_unreadable = true`: the file, named once",
                                "with `skip_unreadable = true`: the count"})
    seen.insert({row, expect_docs_quote(table, row, r.output)});
  EXPECT_NE(r.output.find("skipped: '"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("in epoch 1 (skip_unreadable)"), std::string::npos) << r.output;
  expect_every_row_seen(table, seen, true);
}

struct Refusal {
  const char* name;
  std::string data;      // the [data] table's keys after path, run in data/ (paths under images/)
  std::string docs_row;  // the 'what' cell of docs/data.md's row that quotes the line
  std::function<void(const std::filesystem::path&)> prepare = nullptr;  // given data/images
};

void PrintTo(const Refusal& c, std::ostream* os) { *os << c.name; }

std::vector<Refusal> refusals() {
  return {
      {"NoSuchFolder", "train = \"images/nope\"\n", "a missing folder"},
      {"AFileForAFolder", "train = \"images/train/circle/circle_000.jpg\"\n", "a file where the folder should be"},
      {"NoClassFolders", "train = \"images/train/circle\"\n", "a folder without class folders"},
      {"ClassWithoutImages", "train = \"images/train\"\n", "a class folder without images",
       [](const std::filesystem::path& images) { std::filesystem::create_directories(images / "train" / "a"); }},
      {"ClassWithOtherFilesOnly", "train = \"images/train\"\n", "a class folder without images",
       [](const std::filesystem::path& images) { write_file(images / "train" / "a" / "notes.txt", "not an image\n"); }},
      {"ValClassNotInTrain", "train = \"images/train\"\nval = \"images/val\"\n", "a val/test class train lacks",
       [](const std::filesystem::path& images) {
         write_file(images / "val" / "hexagon" / "h.png", read_file(images / "test" / "circle" / "circle_002.png"));
       }},
      {"UnknownTransform", "train = \"images/train\"\ntransforms = [{ name = \"rotate\" }]\n", "an unknown transform"},
      {"ATransformKeyTypo",
       "train = \"images/train\"\ntransforms = [{ name = \"center_crop\", size = 8, sise = 3 }]\n",
       "an unknown transform key"},
      {"NormalizeOfTheWrongWidth",
       "train = \"images/train\"\ntransforms = [{ name = \"normalize\", mean = [0.5], std = [0.2] }]\n",
       "`normalize` without one mean and std per channel"},
      {"RandomWithoutEvalTransforms",
       "train = \"images/train\"\ntransforms = [{ name = \"random_resized_crop\", size = 32 }]\n",
       "a random `transforms` without `eval_transforms`"},
      {"TwoChannels", "train = \"images/train\"\nchannels = 2\n", "`channels` other than 1, 3 or 4"}};
}

class ImageFolderRefuse : public testing::TestWithParam<Refusal> {};

// Each bad folder or transform: exit 2, nothing written, and one line
// naming it: the line docs/data.md's table of refusals quotes for it.
TEST_P(ImageFolderRefuse, EachBadFolderOrTransformWithOneLineExit2AndNothingWritten) {
  KILN_REQUIRE_CHECK_PYTHON();
  const Refusal& c = GetParam();
  TempDir dir;
  make_own_data(dir);
  if (c.prepare) c.prepare(dir / "data" / "images");
  write_run_manifest(dir, {.name = "",
                           .run = "",
                           .model = "path = \"kiln_cnn\"\nin_channels = 3\nimage_size = 32\nclasses = 3\n",
                           .data = "path = \"kiln_image_folder\"\n" + c.data,
                           .trainer = "max_epochs = 1\nprogress = \"none\"\n",
                           .optimizer = ""});
  const auto before = snapshot(dir.path());
  const ProcessResult r = kiln_in(dir / "data", {"fit", (dir / "run.toml").string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_docs_quote(docs_table("## `kiln_image_folder`"), c.docs_row, r.output);
  EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
  EXPECT_TRUE(snapshot(dir.path()) == before) << "something was written";
}

INSTANTIATE_TEST_SUITE_P(ImageFolder, ImageFolderRefuse, testing::ValuesIn(refusals()),
                         [](const testing::TestParamInfo<Refusal>& info) { return std::string(info.param.name); });

// Every row of docs/data.md's table of refusals is some case's (a row added
// without a case fails here).
TEST(ImageFolderRefuseDocs, EveryRowOfTheTableIsACase) {
  const std::vector<DocsRow> table = docs_table("## `kiln_image_folder`");
  ASSERT_GE(table.size(), 8u) << "docs/data.md's table of refusals, under ## `kiln_image_folder`";
  std::set<std::pair<std::string, int>> seen;
  for (const Refusal& c : refusals()) {
    EXPECT_NE(docs_row(table, c.docs_row), nullptr)
        << c.name << ": docs/data.md's table has no row '" << c.docs_row << "'";
    seen.insert({c.docs_row, 0});
  }
  expect_every_row_seen(table, seen, false);
}

}  // namespace
}  // namespace kiln::test
