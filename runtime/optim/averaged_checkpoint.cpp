#include "optim/averaged_checkpoint.hpp"

#include <cstdlib>

#include "ckpt/tensor_sections.hpp"

namespace kiln {

void AveragedPart::save(CheckpointSnapshot& snapshot) const {
  snapshot.add("average/count", std::to_string(state_.count));
  snapshot.add("average/kind", state_.kind);
  for (const auto& [name, t] : state_.tensors) add_tensor_section(snapshot, "average/" + name, t);
}

void AveragedPart::check(const CheckpointFile& file) const {
  if (!file.has("average/count")) return;
  for (const auto& [name, t] : state_.tensors)
    if (!file.has("average/" + name))
      throw CheckpointError(file.path().string() + ": the averaged weights have no '" + name +
                            "' (a checkpoint of another model?)");
}

void AveragedPart::load(const CheckpointFile& file) {
  if (!file.has("average/count")) return;
  const std::string count(file.section("average/count"));
  char* end = nullptr;
  const long long n = std::strtoll(count.c_str(), &end, 10);
  if (count.empty() || *end != '\0' || n < 0)
    throw CheckpointError(file.path().string() + ": average/count is not a count ('" + count + "')");
  state_.restored_kind = file.has("average/kind") ? std::string(file.section("average/kind")) : "";
  for (auto& [name, t] : state_.tensors) restore_tensor_section(file, "average/" + name, "averaged " + name, t);
  state_.count = n;
  state_.restored = true;
}

}  // namespace kiln
