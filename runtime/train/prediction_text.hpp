// predictions.txt: `kiln predict`'s outputs as text, for models whose rows
// are bytes (a character-level language model's generated text). Opt-in
// with `[trainer] predictions_text = true`: a uint8 tensor is not always
// text, so the host never guesses.
#pragma once

#include <string>

#include <ATen/ATen.h>

namespace kiln {

// Each row of `outputs` (uint8, [N, L]) as its bytes under a
// "--- row N ---" line. Throws InputError naming trainer.predictions_text
// when the outputs are not uint8 rows.
std::string prediction_text(const at::Tensor& outputs);

}  // namespace kiln
