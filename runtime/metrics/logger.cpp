#include "metrics/logger.hpp"

namespace kiln {

const char* kind_name(LogRow::Kind kind) { return kind == LogRow::Kind::step ? "step" : "epoch"; }

}  // namespace kiln
