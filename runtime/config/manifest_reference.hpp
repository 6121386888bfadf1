// docs/manifest.md, written from the manifest schema: every host key with its
// type, default, allowed values and one line of documentation. `kiln
// manifest-reference` prints it; a test fails when the committed file is
// stale.
#pragma once

#include <string>

namespace kiln {

std::string manifest_reference_markdown();

}  // namespace kiln
