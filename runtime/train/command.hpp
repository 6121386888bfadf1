// The commands that run a manifest's plugins.
#pragma once

namespace kiln {

enum class Command { fit, validate, test, predict };
const char* command_name(Command command);

}  // namespace kiln
