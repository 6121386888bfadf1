// kiln.csv — a table in a CSV file (RFC 4180, a header row): the feature
// columns as the batch's float32 "input", one column as its "target". The
// files are parsed once, in setup.
//
// [data]
// path = "kiln_csv"
// train = "train.csv"
// val = "val.csv"               # optional; or
// val_fraction = 0.2            # held out of train: a permutation seeded by `seed`
// test = "test.csv"             # optional; also the predict split
// target = "species"            # the target column ("" = none)
// features = ["a", "b"]         # optional; default: every column but the target
// target_type = "auto"          # "auto", "class" or "number" (csv_table.hpp)
// delimiter = ","
// seed = 0
//
// Class names (a target that is not numbers) are numbered in sorted order;
// the list is written to <run dir>/kiln.csv/classes.json.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "csv_table.hpp"
#include "kiln/plugin.hpp"
#include "kiln_plugins/by_split.hpp"
#include "kiln_plugins/class_list.hpp"
#include "kiln_plugins/held_out.hpp"
#include "kiln_plugins/sample_index.hpp"

namespace {

constexpr const char* kId = "kiln.csv";

struct Split {
  at::Tensor input, target;  // [rows, features] float32; [rows] int64 or float32
  at::Tensor rows;           // int64 row numbers when the split is a subset (val_fraction)
  int64_t length = 0;
};

class Csv final : public kiln::DataModule {
 public:
  Csv(const kiln::Host& host, kiln::Config& config) : DataModule(host) {
    train_file_ = config.require<std::string>("train");
    val_file_ = config.get<std::string>("val", "");
    test_file_ = config.get<std::string>("test", "");
    columns_.target = config.get<std::string>("target", "target");
    columns_.features = config.get_list<std::string>("features", {});
    target_type_ = config.get<std::string>("target_type", "auto");
    const std::string delimiter = config.get<std::string>("delimiter", ",");
    val_fraction_ = config.get<double>("val_fraction", 0.0);
    seed_ = static_cast<uint64_t>(config.get<int64_t>("seed", 0));
    if (delimiter.size() != 1 || delimiter == "\"" || delimiter == "\n" || delimiter == "\r")
      throw kiln::ConfigError("'delimiter' is one character other than a quote or a line end, got '" + delimiter + "'");
    delimiter_ = delimiter[0];
    if (target_type_ != "auto" && target_type_ != "class" && target_type_ != "number")
      throw kiln::ConfigError("'target_type' is \"auto\", \"class\" or \"number\", got '" + target_type_ + "'");
    if (!(val_fraction_ >= 0.0 && val_fraction_ < 1.0))
      throw kiln::ConfigError("'val_fraction' must be in [0, 1), got " + std::to_string(val_fraction_));
    if (val_fraction_ > 0.0 && !val_file_.empty())
      throw kiln::ConfigError("'val' and 'val_fraction' both name a validation split; keep one");
  }

  void setup(kiln::Stage) override {
    try {
      const kiln_csv::Table train = read(train_file_, columns_);
      if (train.rows == 0) throw kiln_csv::CsvError("'" + train_file_ + "': has a header but no rows");
      if (!columns_.target.empty()) {
        encoding_ = kiln_csv::choose_encoding(train, target_type_);
        if (encoding_.kind == kiln_csv::TargetEncoding::named) save_classes();
      }
      // The other splits read train's feature columns, by name, in train's order.
      const kiln_csv::Columns same{columns_.target, train.features};
      train_ = split_of(train);
      if (!val_file_.empty()) val_ = split_of(read(val_file_, same));
      if (!test_file_.empty()) test_ = split_of(read(test_file_, same));
    } catch (const kiln_csv::CsvError& e) {
      throw kiln::InvalidInput(e.what());
    }
    if (val_fraction_ > 0.0) kiln_plugins::hold_out_val(host(), kId, train_, val_, val_fraction_, seed_);
  }

  void teardown(kiln::Stage, bool) override { train_ = val_ = test_ = Split{}; }

  int64_t length(kiln::Split split) override { return select(split).length; }

  // Read-only tensors after setup, hence KILN_DATA_CONCURRENT_GET_BATCH.
  kiln::TensorMap get_batch(kiln::Split split, const int64_t* indices, size_t count) override {
    const Split& data = select(split);
    at::Tensor index = kiln_plugins::sample_index(indices, count, data.length);
    if (data.rows.defined()) index = data.rows.index_select(0, index);
    kiln::TensorMap batch{{"input", data.input.index_select(0, index)}};
    if (data.target.defined()) batch.emplace_back("target", data.target.index_select(0, index));
    return batch;
  }

 private:
  kiln_csv::Table read(const std::string& path, const kiln_csv::Columns& columns) const {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw kiln_csv::CsvError("'" + path + "': cannot be opened");
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) throw kiln_csv::CsvError("'" + path + "': cannot be read");
    return kiln_csv::read_table(path, text.str(), columns, delimiter_);
  }

  Split split_of(const kiln_csv::Table& table) const {
    Split s;
    s.length = table.rows;
    const auto width = static_cast<int64_t>(table.features.size());
    s.input = torch::from_blob(const_cast<float*>(table.values.data()), {table.rows, width}, torch::kFloat).clone();
    if (!columns_.target.empty()) {
      const std::vector<double> values = kiln_csv::encode_targets(table, encoding_);
      const at::Tensor t = torch::from_blob(const_cast<double*>(values.data()), {table.rows}, torch::kDouble);
      s.target = encoding_.kind == kiln_csv::TargetEncoding::number ? t.to(torch::kFloat) : t.to(torch::kLong);
    }
    return s;
  }

  void save_classes() const {
    const bool saved = kiln_plugins::save_class_list(host(), encoding_.names);
    host().info(std::to_string(encoding_.names.size()) + " classes in column '" + columns_.target +
                "', numbered in sorted order" + (saved ? " (<run dir>/" + std::string(kId) + "/classes.json)" : "") +
                ": " + kiln_csv::name_list(std::vector<std::string>(
                           encoding_.names.begin(), encoding_.names.begin() + std::min<size_t>(encoding_.names.size(), 10))) +
                (encoding_.names.size() > 10 ? ", ..." : ""));
  }

  const Split& select(kiln::Split split) const { return kiln_plugins::by_split(split, train_, val_, test_); }

  std::string train_file_, val_file_, test_file_, target_type_;
  kiln_csv::Columns columns_;
  char delimiter_ = ',';
  double val_fraction_ = 0.0;
  uint64_t seed_ = 0;
  kiln_csv::TargetEncoding encoding_;
  Split train_, val_, test_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<Csv>({kId, "CSV tables", "0.1.0",
                                         "A CSV table's feature columns as input, one column as target",
                                         KILN_DATA_CONCURRENT_GET_BATCH}))
