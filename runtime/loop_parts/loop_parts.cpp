#include "loop_parts/loop_parts.hpp"

namespace kiln {

const char* split_name(kiln_split split) {
  switch (split) {
    case KILN_SPLIT_TRAIN: return "train";
    case KILN_SPLIT_VAL: return "val";
    case KILN_SPLIT_TEST: return "test";
    default: return "predict";
  }
}

const char* event_name(Event event) {
  switch (event) {
    case Event::fit_start: return "on_fit_start";
    case Event::train_epoch_start: return "on_train_epoch_start";
    case Event::train_batch_end: return "on_train_batch_end";
    case Event::train_epoch_end: return "on_train_epoch_end";
    case Event::validation_start: return "on_validation_start";
    case Event::validation_end: return "on_validation_end";
    case Event::test_end: return "on_test_end";
    case Event::fit_end: return "on_fit_end";
  }
  return "?";
}

kiln_progress LoopContext::progress_at(kiln_stage stage, int64_t epoch, int64_t batch_index) const {
  kiln_progress p{};
  p.struct_size = sizeof(p);
  p.stage = stage;
  p.epoch = epoch;
  p.global_step = global_step;
  p.batch_index = batch_index;
  p.max_epochs = max_epochs;
  p.max_steps = max_steps;
  return p;
}

}  // namespace kiln
