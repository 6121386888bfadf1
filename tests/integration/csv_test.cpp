// kiln_csv (plugins/csv): a table written by Python's csv module trains to
// the same numbers, bit for bit, as the same data saved as .npy and read by
// kiln_arrays; its string classes are numbered in sorted order and the list
// is in the run directory; and each unusable table is one line naming the
// file, line and column, exit 2, with nothing written.
#include <gtest/gtest.h>

#include <set>

#include "common.hpp"
#include "docs_table.hpp"

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
# The broken tables, each in its own directory as train.csv (val.csv), the
# names docs/data.md's table quotes.
def bad(case, text, name="train"):
    os.makedirs(f"{out}/bad/{case}", exist_ok=True)
    open(f"{out}/bad/{case}/{name}.csv", "w").write(text)
bad("missing", "a,b,y\n1,2,x\n3,,y\n")
bad("missing_label", "a,b,y\n1,2,x\n3,4,\n")
bad("word", "a,b,y\n1,2,x\n3,four,y\n")
bad("beyond_float32", "a,x,y\n1,1e39,p\n")
bad("ragged", "a,b,y\n1,2,x\n3,4\n")
bad("unclosed", "a,b,y\n1,2,x\n3,4,\"y\n")
bad("after_quote", "a,b,y\n1,2,x\n3,\"4\"5,y\n")
bad("quote_inside", "a,b,y\n1,2,x\n3,4\"5,y\n")
bad("no_target", "a,b,y\n1,2,x\n3,4,y\n")
bad("header_twice", "x,x,y\n1,2,p\n")
bad("val_class", "a,b,y\n1,2,x\n3,4,y\n")
bad("val_class", "a,b,y\n1,2,x\n3,4,zebra\n", "val")
bad("empty", "")
bad("no_rows", "a,b,y\n")
os.makedirs(f"{out}/bad/no_file", exist_ok=True)
print("written")
)PY";

std::filesystem::path make_data(const TempDir& dir) { return make_data_with(dir, kMakeData); }

std::filesystem::path manifest(const TempDir& dir, const std::string& run_name, const std::string& data_lines,
                               int features = 16) {
  return write_run_manifest(dir, {.name = "csv",
                                  .run_dir = (dir / run_name).string(),
                                  .model = mlp_keys(features, "[16]", 4),
                                  .data = data_lines,
                                  .trainer = trainer_keys(4, 32),
                                  .file = run_name + ".toml"});
}

std::string q(const std::filesystem::path& p) { return "\"" + p.string() + "\""; }


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
  std::string name;        // also the directory under data/bad kiln runs in, which holds the table
  std::string data_lines;  // the [data] keys after path, the files named as in that directory
  std::string docs_row;    // the 'what' cell of docs/data.md's row that quotes the line
};

// Each unusable table: exit 2, nothing written, and one line naming the
// file (its line and column): a line docs/data.md's table quotes for that
// case. Every row of that table, and every line a row quotes, is some case's
// (a row added without a case fails here).
TEST(CsvRefuse, EachBadTableWithOneLineNamingFileLineAndColumnExit2AndNothingWritten) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto data = make_data(dir);
  const std::string train = "target = \"y\"\ntrain = \"train.csv\"\n";
  const std::string empty_cell = "an empty cell";
  const std::string quotes = "an unclosed quote, text after a closing quote, a quote inside an unquoted field";
  const std::vector<Refusal> refusals{
      {"missing", train, empty_cell},
      {"missing_label", train, empty_cell},
      {"word", train, "a cell that is not a number"},
      {"beyond_float32", train, "a number beyond float32"},
      {"ragged", train, "a record with another number of fields"},
      {"unclosed", train, quotes},
      {"after_quote", train, quotes},
      {"quote_inside", train, quotes},
      {"no_target", "target = \"label\"\ntrain = \"train.csv\"\n", "a column the header lacks"},
      {"header_twice", train, "a header naming a column twice"},
      {"val_class", train + "val = \"val.csv\"\n", "a class the train split lacks"},
      {"empty", train, "an empty file"},
      {"no_rows", train, "a header without rows"},
      {"no_file", train, "a file that cannot be opened"}};

  const std::vector<DocsRow> table = docs_table("## `kiln_csv`");
  ASSERT_GE(table.size(), 10u) << "docs/data.md's table of refused tables, under ## `kiln_csv`";
  std::set<std::pair<std::string, int>> seen;
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.name);
    const auto file = manifest(dir, refusal.name, "path = \"kiln_csv\"\n" + refusal.data_lines, 2);
    const ProcessResult r = kiln({"fit", file.string()}, {.cwd = data / "bad" / refusal.name, .timeout = kTimeout});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    seen.insert({refusal.docs_row, expect_docs_quote(table, refusal.docs_row, r.output)});
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / refusal.name)) << "nothing written";
  }
  expect_every_row_seen(table, seen, true);
}

}  // namespace
}  // namespace kiln::test
