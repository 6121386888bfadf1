#include "train/prediction_text.hpp"

#include "util/errors.hpp"

namespace kiln {

std::string prediction_text(const at::Tensor& outputs) {
  if (outputs.scalar_type() != at::kByte || outputs.dim() != 2) {
    std::string shape;
    for (int64_t d = 0; d < outputs.dim(); ++d) shape += (d ? ", " : "") + std::to_string(outputs.size(d));
    throw InputError("trainer.predictions_text: the model's predictions are " +
                     std::string(c10::toString(outputs.scalar_type())) + " [" + shape +
                     "], not uint8 rows of bytes; set predictions_text = false (predictions.pt is not written either)");
  }
  const at::Tensor rows = outputs.contiguous();
  const auto* bytes = rows.data_ptr<uint8_t>();
  const int64_t n = rows.size(0), width = rows.size(1);
  std::string text;
  text.reserve(static_cast<size_t>(n * (width + 20)));
  for (int64_t r = 0; r < n; ++r) {
    text += "--- row " + std::to_string(r) + " ---\n";
    text.append(reinterpret_cast<const char*>(bytes + r * width), static_cast<size_t>(width));
    text += '\n';
  }
  return text;
}

}  // namespace kiln
