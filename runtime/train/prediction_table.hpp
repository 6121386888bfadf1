// predictions.csv: `kiln predict`'s rows as a table a person reads, beside
// predictions.pt. For a classifier's outputs (scores [N, C], or class
// indices [N]) each row gets its predicted class, by index and, where the
// data module recorded them in the run directory (kiln_host.run_file_write,
// docs/data.md), by name, and the sample's own name:
//   <data id>/classes.json        a JSON array of class names, index order
//   <data id>/predict_names.txt   one name per predict sample, index order
// (kiln_csv and kiln_image_folder write them: the table's class column, the
// image files' paths). Other outputs get no table.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace kiln {

// A JSON array of strings (what the shipped data modules write), or nullopt
// when `text` is not one.
std::optional<std::vector<std::string>> parse_string_array(const std::string& text);

// The table's text, or nullopt when `outputs` are not a classifier's. Empty
// `classes` or `names`: their columns are left out (also when their count
// does not match: `warning` then says why).
std::optional<std::string> prediction_table(const at::Tensor& outputs, const std::vector<std::string>& classes,
                                            const std::vector<std::string>& names, std::string* warning);

}  // namespace kiln
