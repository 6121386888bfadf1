// kiln_arrays (plugins/arrays): the same data written by NumPy as .npy files
// (C and Fortran order), as .npz (stored and deflated) and by safetensors as
// one .safetensors file trains to the same numbers, bit for bit; a held-out
// fraction is a seeded choice, recorded in the run directory; and
// each unusable file is one line naming it (and the key), exit 2, with
// nothing written: the line docs/data.md's table quotes for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "common.hpp"
#include "docs_table.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(300);

// Four Gaussian classes in 16 features, 256 training rows and 64 test rows,
// from a fixed seed, in every form the test reads; and the broken files.
constexpr const char* kMakeData = R"PY(
import sys, numpy as np
from safetensors.numpy import save_file
out = sys.argv[1]
rng = np.random.default_rng(7)
centroids = rng.normal(size=(4, 16)).astype(np.float32)
def split(n):
    y = np.arange(n) % 4
    x = (centroids[y] + 0.8 * rng.normal(size=(n, 16))).astype(np.float32)
    return x, y.astype(np.int64)
x, y = split(256)
tx, ty = split(64)
import os
for d in ("c", "f", "test", "bad"):
    os.makedirs(f"{out}/{d}", exist_ok=True)
np.save(f"{out}/c/x.npy", x); np.save(f"{out}/c/y.npy", y)
np.save(f"{out}/f/x.npy", np.asfortranarray(x)); np.save(f"{out}/f/y.npy", y.astype(np.int32))
np.save(f"{out}/test/x.npy", tx); np.save(f"{out}/test/y.npy", ty)
save_file({"x": x, "y": y}, f"{out}/train.safetensors")
save_file({"x": tx, "y": ty}, f"{out}/test.safetensors")
np.savez(f"{out}/train_stored.npz", x=x, y=y)
np.savez_compressed(f"{out}/train_deflated.npz", x=np.asfortranarray(x), y=y.astype(np.uint8))
np.savez_compressed(f"{out}/test.npz", x=tx, y=ty)
assert np.load(f"{out}/f/x.npy").flags.f_contiguous
# The broken ones.
os.makedirs(f"{out}/bad/short", exist_ok=True)
np.save(f"{out}/bad/short/y.npy", y[:255])
np.save(f"{out}/bad/complex.npy", x.astype(np.complex64))
np.save(f"{out}/bad/big_endian.npy", x.astype(">f4"))
np.save(f"{out}/bad/objects.npy", np.array([{"a": 1}] * 256, dtype=object), allow_pickle=True)
np.save(f"{out}/bad/fields.npy", np.zeros(256, dtype=[("a", "<f4"), ("b", "<i4")]))
whole = open(f"{out}/c/x.npy", "rb").read()
open(f"{out}/bad/truncated.npy", "wb").write(whole[: len(whole) - 100])
open(f"{out}/bad/extra.npy", "wb").write(whole + bytes(100))  # its header claims fewer bytes than it holds
st = open(f"{out}/train.safetensors", "rb").read()
open(f"{out}/bad/truncated.safetensors", "wb").write(st[: len(st) - 8])
import json, struct
header = json.dumps({"x": {"dtype": "F8_E4M3", "shape": [256, 16], "data_offsets": [0, 4096]}}).encode()
open(f"{out}/bad/float8.safetensors", "wb").write(struct.pack("<Q", len(header)) + header + bytes(4096))
import io, zipfile
with zipfile.ZipFile(f"{out}/bad/bzip2.npz", "w", compression=zipfile.ZIP_BZIP2) as z:
    for k, v in (("x", x), ("y", y)):
        b = io.BytesIO(); np.save(b, v); z.writestr(k + ".npy", b.getvalue())
npz = bytearray(open(f"{out}/train_deflated.npz", "rb").read())
open(f"{out}/bad/truncated.npz", "wb").write(bytes(npz[: len(npz) // 2]))
npz[200] ^= 0x55  # inside x.npy's deflated bytes
open(f"{out}/bad/damaged.npz", "wb").write(bytes(npz))
print("written")
)PY";

std::filesystem::path make_data(const TempDir& dir) { return make_data_with(dir, kMakeData); }

// A manifest whose [data] table holds `data_lines`; run dir `run_name`.
std::filesystem::path manifest(const TempDir& dir, const std::string& run_name, const std::string& data_lines) {
  return write_run_manifest(dir, {.name = "arrays",
                                  .run_dir = (dir / run_name).string(),
                                  .model = mlp_keys(16, "[16]", 4),
                                  .data = "path = \"kiln_arrays\"\n" + data_lines,
                                  .trainer = trainer_keys(4, 32),
                                  .file = run_name + ".toml"});
}

std::string q(const std::filesystem::path& p) { return "\"" + p.string() + "\""; }


TEST(Arrays, NpyInEitherOrderAndSafetensorsTrainToTheSameNumbers) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto data = make_data(dir);
  const std::string val_npy = "val = [" + q(data / "test" / "x.npy") + ", " + q(data / "test" / "y.npy") + "]\n";
  const std::map<std::string, std::string> forms = {
      {"npy_c", "train = [" + q(data / "c" / "x.npy") + ", " + q(data / "c" / "y.npy") + "]\n" + val_npy +
                    "input = \"x\"\ntarget = \"y\"\n"},
      {"npy_fortran", "train = [" + q(data / "f" / "x.npy") + ", " + q(data / "f" / "y.npy") + "]\n" + val_npy +
                          "input = \"x\"\ntarget = \"y\"\n"},
      {"safetensors", "train = " + q(data / "train.safetensors") + "\nval = " + q(data / "test.safetensors") +
                          "\ninput = \"x\"\ntarget = \"y\"\n"},
      {"npz_stored", "train = " + q(data / "train_stored.npz") + "\nval = " + q(data / "test.npz") +
                         "\ninput = \"x\"\ntarget = \"y\"\n"},
      {"npz_deflated", "train = " + q(data / "train_deflated.npz") + "\nval = " + q(data / "test.npz") +
                           "\ninput = \"x\"\ntarget = \"y\"\n"}};
  std::map<std::string, std::vector<std::map<std::string, double>>> logged;
  for (const auto& [name, lines] : forms) {
    const ProcessResult r = kiln({"fit", manifest(dir, name, lines).string()}, {.timeout = kTimeout});
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    logged[name] = rows_without_timings(dir / name / "metrics.csv");
  }
  ASSERT_FALSE(logged["npy_c"].empty());
  EXPECT_GE(last_value(logged["npy_c"], "val/acc"), 0.8) << "the classes are well apart";
  EXPECT_EQ(logged["npy_c"], logged["npy_fortran"]) << "a Fortran-order array is read in its logical order";
  EXPECT_EQ(logged["npy_c"], logged["safetensors"]) << "the same bytes through either format";
  EXPECT_EQ(logged["npy_c"], logged["npz_stored"]) << "numpy.savez";
  EXPECT_EQ(logged["npy_c"], logged["npz_deflated"]) << "numpy.savez_compressed (Fortran order, uint8 classes)";
}

// val_fraction holds out a seeded choice of train's rows: the same seed, the
// same validation numbers; another seed, another choice.
TEST(Arrays, AHeldOutFractionIsASeededChoiceOfTrainsRows) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto data = make_data(dir);
  const auto lines = [&](int seed) {
    return "train = " + q(data / "train.safetensors") + "\ninput = \"x\"\ntarget = \"y\"\nval_fraction = 0.25\nseed = " +
           std::to_string(seed) + "\n";
  };
  std::vector<std::vector<std::map<std::string, double>>> runs;
  for (const auto& [name, seed] : std::vector<std::pair<std::string, int>>{{"a", 1}, {"b", 1}, {"c", 2}}) {
    const ProcessResult r = kiln({"fit", manifest(dir, name, lines(seed)).string()}, {.timeout = kTimeout});
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    runs.push_back(rows_without_timings(dir / name / "metrics.csv"));
    EXPECT_NE(r.output.find("val/acc"), std::string::npos) << r.output;
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_NE(runs[0], runs[2]);
  // The rows each run held out, as NumPy reads them: a quarter of train's
  // 256, sorted, disjoint from the rows trained on, the same for the same seed.
  const std::string check = R"PY(
import sys, numpy as np
a, b, c = (sys.argv[i] + "/kiln.arrays/" for i in (1, 2, 3))
val, train = np.load(a + "val_rows.npy"), np.load(a + "train_rows.npy")
assert val.dtype == np.int64 and val.shape == (64,) and train.shape == (192,), (val.shape, train.shape)
assert (np.diff(val) > 0).all() and (np.diff(train) > 0).all()
assert np.array_equal(np.union1d(val, train), np.arange(256))
assert np.array_equal(val, np.load(b + "val_rows.npy"))
assert not np.array_equal(val, np.load(c + "val_rows.npy"))
print("rows ok")
)PY";
  write_file(dir / "check_rows.py", check);
  const ProcessResult r = run_process({check_python().string(), (dir / "check_rows.py").string(), (dir / "a").string(),
                                       (dir / "b").string(), (dir / "c").string()},
                                      {.timeout = kTimeout});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

struct Refusal {
  std::string name;
  std::string data_lines;  // with DATA standing for the data directory
  std::string docs_row;    // the 'what' cell of docs/data.md's row that quotes the line
  std::string names;       // the file (or key) the line names; empty: none
};

// Each unusable file: one line naming it (and the key), exit 2, no training;
// the line is one docs/data.md's table quotes for that case, and every row of
// that table is some case's (a row added without a case fails here).
TEST(ArraysRefuse, EachBadFileWithOneLineNamingItExit2AndNothingWritten) {
  KILN_REQUIRE_CHECK_PYTHON();
  TempDir dir;
  const auto data = make_data(dir);
  const std::string truncated = "a truncated file, or a header that claims more bytes than the file holds";
  const std::string another_dtype = "another dtype (complex, unsigned wider than 8 bits, float8)";
  const std::string damaged_npz = "a truncated or damaged `.npz`";
  const std::vector<Refusal> refusals{
      {"missing_key", "train = \"DATA/train.safetensors\"\ninput = \"features\"\ntarget = \"y\"\n",
       "a key the files do not have", "train.safetensors'"},
      {"rows_differ", "train = [\"DATA/c/x.npy\", \"DATA/bad/short/y.npy\"]\ninput = \"x\"\ntarget = \"y\"\n",
       "first dimensions that differ", "bad/short/y.npy'"},
      {"truncated_npy", "train = [\"DATA/bad/truncated.npy\"]\ninput = \"truncated\"\ntarget = \"\"\n", truncated,
       "truncated.npy'"},
      {"truncated_safetensors", "train = \"DATA/bad/truncated.safetensors\"\ninput = \"x\"\ntarget = \"y\"\n",
       truncated, "truncated.safetensors'"},
      {"extra_bytes_npy", "train = [\"DATA/bad/extra.npy\"]\ninput = \"extra\"\ntarget = \"\"\n",
       "a `.npy` header that claims fewer bytes than the file holds", "extra.npy'"},
      {"big_endian", "train = [\"DATA/bad/big_endian.npy\"]\ninput = \"big_endian\"\ntarget = \"\"\n",
       "big-endian data", "big_endian.npy'"},
      {"objects", "train = [\"DATA/bad/objects.npy\"]\ninput = \"objects\"\ntarget = \"\"\n",
       "Python objects (`dtype=object`)", "objects.npy'"},
      {"structured", "train = [\"DATA/bad/fields.npy\"]\ninput = \"fields\"\ntarget = \"\"\n",
       "a structured dtype (fields)", "fields.npy'"},
      {"complex_npy", "train = [\"DATA/bad/complex.npy\"]\ninput = \"complex\"\ntarget = \"\"\n", another_dtype,
       "complex.npy'"},
      {"float8_safetensors", "train = \"DATA/bad/float8.safetensors\"\ninput = \"x\"\ntarget = \"\"\n", another_dtype,
       "float8.safetensors'"},
      {"not_a_format", "train = \"DATA/../make_data.py\"\ninput = \"x\"\n",
       "a file that is not `.npy`, `.npz` nor `.safetensors`", "make_data.py'"},
      {"npz_bzip2", "train = \"DATA/bad/bzip2.npz\"\ninput = \"x\"\ntarget = \"y\"\n",
       "a `.npz` member compressed other than by deflate (bzip2, lzma), encrypted, or not a `.npy`",
       "bzip2.npz:x.npy'"},
      {"npz_truncated", "train = \"DATA/bad/truncated.npz\"\ninput = \"x\"\ntarget = \"y\"\n", damaged_npz,
       "truncated.npz'"},
      {"npz_damaged", "train = \"DATA/bad/damaged.npz\"\ninput = \"x\"\ntarget = \"y\"\n", damaged_npz,
       "damaged.npz:x.npy'"},
      {"both_val_keys", "train = \"DATA/train.safetensors\"\nval = \"DATA/test.safetensors\"\nval_fraction = 0.1\n"
                        "input = \"x\"\ntarget = \"y\"\n",
       "`val` and `val_fraction` together", ""}};

  const std::vector<DocsRow> table = docs_table("## `kiln_arrays`");
  ASSERT_GE(table.size(), 10u) << "docs/data.md's table of refused array files, under ## `kiln_arrays`";
  std::set<std::string> exercised;
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.name);
    const auto row =
        std::find_if(table.begin(), table.end(), [&](const DocsRow& d) { return d.what == refusal.docs_row; });
    ASSERT_NE(row, table.end()) << "docs/data.md's table has no row '" << refusal.docs_row << "'";
    ASSERT_FALSE(row->messages.empty()) << "docs/data.md's row '" << row->what << "' quotes no line";
    exercised.insert(row->what);
    std::string lines = refusal.data_lines;
    for (size_t at; (at = lines.find("DATA")) != std::string::npos;) lines.replace(at, 4, data.string());
    const ProcessResult r = kiln({"fit", manifest(dir, refusal.name, lines).string()}, {.timeout = kTimeout});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    const bool quoted = std::any_of(row->messages.begin(), row->messages.end(),
                                    [&](const auto& pieces) { return has_line_with(r.output, pieces); });
    EXPECT_TRUE(quoted) << "no line is one docs/data.md quotes for '" << row->what << "':\n" << r.output;
    EXPECT_NE(r.output.find(refusal.names), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / refusal.name)) << "nothing written";
  }
  for (const auto& row : table)
    EXPECT_TRUE(exercised.count(row.what)) << "docs/data.md's row '" << row.what << "' has no case here";
}

}  // namespace
}  // namespace kiln::test
