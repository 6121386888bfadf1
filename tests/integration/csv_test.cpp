// kiln_csv (plugins/csv): a table written by Python's csv module trains to
// the same numbers, bit for bit, as the same data saved as .npy and read by
// kiln_arrays; its string classes are numbered in sorted order and the list
// is in the run directory; and each unusable table is one line naming the
// file, line and column, exit 2, with nothing written.
#include <gtest/gtest.h>

#include "common.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(300);

// Four classes named by strings (one with a comma and a quote, so the
// writer quotes it), 16 features printed with 9 significant digits (float32
// round-trips exactly), 256 training rows and 64 validation rows; the same
// as .npy; and the broken tables.
constexpr const char* kMakeData = R"PY(
import csv, os, sys, numpy as np
out = sys.argv[1]
os.makedirs(out + "/bad", exist_ok=True)
rng = np.random.default_rng(11)
names = np.array(["setosa", "virginica", 'ver,si "color"', "Arctica"])
centroids = rng.normal(size=(4, 16)).astype(np.float32)
header = ["f%d" % i for i in range(8)] + ["species"] + ["f%d" % i for i in range(8, 16)]
def split(n, stem, crlf):
    y = np.arange(n) % 4
    x = (centroids[y] + 0.8 * rng.normal(size=(n, 16))).astype(np.float32)
    with open(f"{out}/{stem}.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\r\n" if crlf else "\n")
        w.writerow(header)
        for row, label in zip(x, names[y]):
            cells = ["%.9g" % v for v in row]
            w.writerow(cells[:8] + [label] + cells[8:])
    classes = sorted(set(names.tolist()))
    os.makedirs(f"{out}/{stem}", exist_ok=True)
    np.save(f"{out}/{stem}/x.npy", x)
    np.save(f"{out}/{stem}/y.npy", np.array([classes.index(s) for s in names[y]], dtype=np.int64))
split(256, "train", False)
split(64, "val", True)
def bad(name, text):
    open(f"{out}/bad/{name}.csv", "w").write(text)
bad("missing", "a,b,y\n1,2,x\n3,,y\n")
bad("word", "a,b,y\n1,2,x\n3,four,y\n")
bad("ragged", "a,b,y\n1,2,x\n3,4\n")
bad("unclosed", "a,b,y\n1,2,x\n3,4,\"y\n")
bad("empty", "")
bad("val_class", "a,b,y\n1,2,x\n3,4,zebra\n")
bad("train_xy", "a,b,y\n1,2,x\n3,4,y\n")
print("written")
)PY";

std::filesystem::path make_data(const TempDir& dir) {
  write_file(dir / "make_data.py", kMakeData);
  const ProcessResult r = run_process({check_python().string(), (dir / "make_data.py").string(), (dir / "data").string()},
                                      {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir / "data";
}

std::filesystem::path manifest(const TempDir& dir, const std::string& run_name, const std::string& data_lines,
                               int features = 16) {
  const auto file = dir / (run_name + ".toml");
  write_file(file, "[run]\nname = \"csv\"\ndir = \"" + (dir / run_name).string() +
                       "\"\nseed = 3\nthreads = 1\n\n[model]\npath = \"kiln_mlp\"\nin_features = " +
                       std::to_string(features) + "\nhidden = [16]\nclasses = 4\n\n[data]\n" + data_lines +
                       "\n[trainer]\nmax_epochs = 4\nbatch_size = 32\nprogress = \"none\"\n\n"
                       "[optimizer]\nname = \"adam\"\nlr = 0.01\n");
  return file;
}

std::string q(const std::filesystem::path& p) { return "\"" + p.string() + "\""; }

std::vector<std::map<std::string, double>> rows_without_timings(const std::filesystem::path& csv) {
  auto rows = read_metrics(csv);
  for (auto& row : rows) erase_timings(row);
  return rows;
}

TEST(Csv, ATableTrainsToTheSameNumbersAsItsArraysAndRecordsItsClasses) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto data = make_data(dir);
  const ProcessResult table = kiln(
      {"fit", manifest(dir, "table", "path = \"kiln_csv\"\ntrain = " + q(data / "train.csv") + "\nval = " +
                                         q(data / "val.csv") + "\ntarget = \"species\"\n")
                  .string()},
      {.timeout = kTimeout});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("4 classes in column 'species', numbered in sorted order"), std::string::npos)
      << table.output;
  // kiln inspect: the splits, a sample's tensors and the class list, with nothing written.
  const ProcessResult inspected =
      kiln({"inspect", manifest(dir, "inspected", "path = \"kiln_csv\"\ntrain = " + q(data / "train.csv") +
                                                      "\nval_fraction = 0.25\ntarget = \"species\"\n")
                           .string()},
           {.timeout = kTimeout});
  ASSERT_EQ(inspected.exit_code, 0) << inspected.output;
  for (const char* line : {"train: 192 samples", "val: 64 samples", "test: 0 samples", "input: float32 [16]",
                           "target: int64 []", "run file kiln.csv/classes.json: [\"Arctica\", \"setosa\", ",
                           "run file kiln.csv/val_rows.npy: "})
    EXPECT_NE(inspected.output.find(line), std::string::npos) << line << "\n" << inspected.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "inspected"));
  const ProcessResult same =
      kiln({"fit", manifest(dir, "arrays", "path = \"kiln_arrays\"\ntrain = [" + q(data / "train" / "x.npy") + ", " +
                                               q(data / "train" / "y.npy") + "]\nval = [" + q(data / "val" / "x.npy") +
                                               ", " + q(data / "val" / "y.npy") + "]\ninput = \"x\"\ntarget = \"y\"\n")
                       .string()},
           {.timeout = kTimeout});
  ASSERT_EQ(same.exit_code, 0) << same.output;
  const auto logged = rows_without_timings(dir / "table" / "metrics.csv");
  ASSERT_FALSE(logged.empty());
  EXPECT_GE(last_value(logged, "val/acc"), 0.8) << "the classes are well apart";
  EXPECT_EQ(logged, rows_without_timings(dir / "arrays" / "metrics.csv"))
      << "the table's numbers and classes are the arrays' exactly";
  // The class list, as JSON: sorted as Python sorts str.
  write_file(dir / "check.py", R"PY(
import json, sys
got = json.load(open(sys.argv[1]))
assert got == sorted(["setosa", "virginica", 'ver,si "color"', "Arctica"]), got
print("classes ok")
)PY");
  const ProcessResult r = run_process(
      {check_python().string(), (dir / "check.py").string(), (dir / "table" / "kiln.csv" / "classes.json").string()},
      {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

struct Refusal {
  std::string name;
  std::string data_lines;  // with DATA standing for the data directory
  std::string expected;    // part of the one line
};

TEST(CsvRefuse, EachBadTableWithOneLineNamingFileLineAndColumnExit2AndNothingWritten) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto data = make_data(dir);
  const std::string two = "path = \"kiln_csv\"\ntarget = \"y\"\ntrain = \"DATA/bad/";
  const std::vector<Refusal> refusals{
      {"missing", two + "missing.csv\"\n", "missing.csv:3:2: column 'b': the cell is empty (a missing value)"},
      {"word", two + "word.csv\"\n", "word.csv:3:2: column 'b': 'four' is not a finite number"},
      {"ragged", two + "ragged.csv\"\n", "ragged.csv:3: 2 fields, the header has 3"},
      {"unclosed", two + "unclosed.csv\"\n", "unclosed.csv:3: a quoted field is never closed"},
      {"empty", two + "empty.csv\"\n", "empty.csv: is empty; a table starts with a header row"},
      {"no_target", "path = \"kiln_csv\"\ntarget = \"label\"\ntrain = \"DATA/bad/word.csv\"\n",
       "word.csv: has no target column 'label'; its columns: a, b, y"},
      {"val_class", two + "train_xy.csv\"\nval = \"DATA/bad/val_class.csv\"\n",
       "val_class.csv:3:3: target column 'y': class 'zebra' is not one of the train split's 2 classes"},
      {"no_file", two + "absent.csv\"\n", "absent.csv': cannot be opened"}};
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.name);
    std::string lines = refusal.data_lines;
    for (size_t at; (at = lines.find("DATA")) != std::string::npos;) lines.replace(at, 4, data.string());
    const ProcessResult r = kiln({"fit", manifest(dir, refusal.name, lines, 2).string()}, {.timeout = kTimeout});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(refusal.expected), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / refusal.name)) << "nothing written";
  }
}

}  // namespace
}  // namespace kiln::test
