// `kiln predict`'s files in the run directory, written by rank 0 (predict
// is not sharded): predictions.pt, every output row for torch.load;
// predictions.txt when `[trainer] predictions_text` asks for it
// (train/prediction_text.hpp); predictions.csv for a classifier's outputs
// (train/prediction_table.hpp). Each file replaces its old one atomically.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace kiln {

// `outputs`: the predict loop's, one tensor per batch, in order. `data_id`:
// the data module's, whose files in the run directory name the table's
// classes and rows. Throws InputError, with nothing written, when `as_text`
// and the outputs are not bytes.
void write_prediction_files(const std::vector<at::Tensor>& outputs, const std::filesystem::path& run_dir,
                            const std::string& data_id, bool as_text);

}  // namespace kiln
