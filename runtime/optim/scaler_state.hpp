// The gradient scaler's state (16-mixed): what a checkpoint keeps of it, so
// that a resumed run scales its next loss exactly as the interrupted one would.
#pragma once

#include <cstdint>

namespace kiln {

struct ScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // good steps since the scale last changed
  int64_t skipped = 0;         // optimizer steps skipped so far (inf/NaN gradients)
};

}  // namespace kiln
