// A batch as the host holds it: what a data module's get_batch returned,
// freed by the host (plugin/host_services.cpp) when the last owner lets
// go. Here, not beside the plugin code, so that the loops, the prefetcher
// and the device code can name it without including the plugin layer.
#pragma once

#include <memory>

#include "kiln/abi.h"

namespace kiln {

struct BatchDeleter {
  void operator()(kiln_batch* batch) const;
};
using BatchPtr = std::unique_ptr<kiln_batch, BatchDeleter>;

}  // namespace kiln
