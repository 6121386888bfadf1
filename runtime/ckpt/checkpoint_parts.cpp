#include "ckpt/checkpoint_parts.hpp"

#include <algorithm>
#include <stdexcept>

namespace kiln {

void CheckpointParts::add(const std::string& name, Stateful& part, int load_priority) {
  if (has(name)) throw std::invalid_argument("checkpoint part '" + name + "' is registered twice");
  parts_.push_back({name, &part, load_priority});
}

void CheckpointParts::replace(const std::string& name, Stateful& part, int load_priority) {
  for (Entry& e : parts_)
    if (e.name == name) {
      e.part = &part;
      e.load_priority = load_priority;
      return;
    }
  add(name, part, load_priority);
}

void CheckpointParts::remove(const std::string& name) {
  parts_.erase(std::remove_if(parts_.begin(), parts_.end(), [&](const Entry& e) { return e.name == name; }),
               parts_.end());
}

bool CheckpointParts::has(const std::string& name) const {
  return std::any_of(parts_.begin(), parts_.end(), [&](const Entry& e) { return e.name == name; });
}

CheckpointSnapshot CheckpointParts::snapshot(SnapshotBuffers* buffers) const {
  CheckpointSnapshot snapshot(buffers);
  for (const Entry& e : parts_) e.part->save(snapshot);
  return snapshot;
}

void CheckpointParts::restore(const CheckpointFile& file) const {
  for (const Entry& e : parts_) e.part->check(file);
  std::vector<const Entry*> order;
  for (const Entry& e : parts_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* a, const Entry* b) { return a->load_priority < b->load_priority; });
  for (const Entry* e : order) e->part->load(file);
}

}  // namespace kiln
