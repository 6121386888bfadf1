// A run's hyperparameters, as TensorBoard's HPARAMS tab shows them: the
// manifest (with --set overrides applied), flattened to dotted keys. The
// TensorBoard logger writes them once, when it creates its file
// (metrics/tensorboard_logger.hpp, docs/logging.md "Hyperparameters").
//
//   [optimizer] lr = 0.003        -> "optimizer.lr" = 0.003 (a number)
//   [model] hidden = [512, 256]   -> "model.hidden" = "[512, 256]" (an array: its TOML text)
//   [[callbacks]] path = "x"      -> "callbacks.0.path" = "x" (arrays of tables: by index)
//
// Integers and floats become numbers (TensorBoard's values are doubles;
// an integer beyond 2^53 loses its last digits), booleans booleans, strings
// strings; NaN, infinities, dates and times their TOML text (a NaN number
// would break the tab's JSON). Only what the manifest writes is there: a key
// left to its default is not.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct HParam {
  enum class Kind { number, string, boolean };
  std::string name;  // dotted: "optimizer.lr", "callbacks.0.path"
  Kind kind = Kind::string;
  double number = 0;
  std::string string;
  bool boolean = false;

  static HParam of_number(std::string name, double value) {
    HParam h;
    h.name = std::move(name);
    h.kind = Kind::number;
    h.number = value;
    return h;
  }
  static HParam of_string(std::string name, std::string value) {
    HParam h;
    h.name = std::move(name);
    h.kind = Kind::string;
    h.string = std::move(value);
    return h;
  }
  static HParam of_bool(std::string name, bool value) {
    HParam h;
    h.name = std::move(name);
    h.kind = Kind::boolean;
    h.boolean = value;
    return h;
  }
  bool operator==(const HParam& o) const {
    return name == o.name && kind == o.kind && number == o.number && string == o.string && boolean == o.boolean;
  }
};

// `toml_text`: a manifest's text (kiln::Manifest::text). In key order (each
// table's keys sorted, as toml++ keeps them). Throws kiln::InputError on text
// that is not TOML (a Manifest's text always is).
std::vector<HParam> flatten_manifest_hparams(const std::string& toml_text);

}  // namespace kiln
