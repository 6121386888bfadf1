// Reading the manifest's schema (config/manifest_schema.cpp declares it):
// a table's keys by name, the optimizers' own keys, the hints for renamed
// keys, and how a default double is shown.
#include "config/manifest_schema.hpp"

#include "util/shortest_double.hpp"

namespace kiln {

std::string float_text(double d) {
  std::string out = shortest_double(d, /*plain=*/true);  // 60.0, not 6e+01
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

const KeySchema* TableSchema::find(const std::string& key) const {
  for (const auto& k : keys) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

std::vector<std::string> TableSchema::key_names() const {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.key);
  return out;
}

const TableSchema* find_table_schema(const std::string& table) {
  for (const auto& t : manifest_schema()) {
    if (t.name == table) return &t;
  }
  return nullptr;
}

const KeySchema* find_key_schema(const std::string& table, const std::string& key) {
  const TableSchema* t = find_table_schema(table);
  return t ? t->find(key) : nullptr;
}

const std::vector<std::string>& optimizer_option_keys(OptimizerName name) {
  static const std::vector<std::string> sgd{"lr", "weight_decay", "momentum", "nesterov"};
  static const std::vector<std::string> adam{"lr", "weight_decay", "betas", "eps"};
  static const std::vector<std::string> rmsprop{"lr", "weight_decay", "momentum", "alpha", "eps", "centered"};
  static const std::vector<std::string> adagrad{"lr", "weight_decay", "lr_decay", "initial_accumulator_value", "eps"};
  switch (name) {
    case OptimizerName::sgd: return sgd;
    case OptimizerName::adam:
    case OptimizerName::adamw: return adam;
    case OptimizerName::rmsprop: return rmsprop;
    case OptimizerName::adagrad: return adagrad;
  }
  return adam;
}

std::string renamed_key_hint(const std::string& table, const std::string& key) {
  struct Renamed {
    const char *table, *key, *hint;
  };
  static const Renamed kRenamed[] = {
      {"trainer", "prefetch", "trainer.data_workers: 0 for inline, a count of threads, or \"auto\""},
      {"trainer", "prefetch_threads", "trainer.data_workers"},
      {"trainer", "prefetch_depth", "trainer.prefetch_batches"},
  };
  for (const Renamed& r : kRenamed)
    if (table == r.table && key == r.key) return std::string(" (renamed: use ") + r.hint + ")";
  return "";
}

}  // namespace kiln
