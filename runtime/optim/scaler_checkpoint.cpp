#include "optim/scaler_checkpoint.hpp"

#include <cstdio>

#include "ckpt/section_fields.hpp"

namespace kiln {

std::string scaler_text(const ScalerState& state) {
  char scale[64];
  std::snprintf(scale, sizeof scale, "%.17g", state.scale);
  return SectionFieldsWriter()
      .add("scale", scale)
      .add("growth_tracker", state.growth_tracker)
      .add("skipped", state.skipped)
      .text();
}

ScalerState read_scaler(const CheckpointFile& file) {
  const SectionFields fields(file, "amp/scaler");
  const auto value = [&](const char* key) { return fields.find(key).value_or(""); };
  const auto scale = parse_field_number(value("scale"));
  const auto growth = parse_field_count(value("growth_tracker"));
  const auto skipped = parse_field_count(value("skipped"));
  if (!scale || !(*scale > 0) || !growth || !skipped)
    throw CheckpointError(fields.where() + " is not a gradient scaler's state (" +
                          printable(file.section("amp/scaler")) + ")");
  return ScalerState{*scale, *growth, *skipped};
}

}  // namespace kiln
