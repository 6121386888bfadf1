// Durations written as Lightning writes max_time: "DD:HH:MM:SS", or the
// shorter "HH:MM:SS". No LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln {

// Seconds in `text`, or nullopt when it is not "[DD:]HH:MM:SS" with
// HH < 24 (when days are given), MM < 60 and SS < 60. "00:00:00" is valid
// (stop after the first step).
std::optional<int64_t> parse_duration_seconds(const std::string& text);

}  // namespace kiln
