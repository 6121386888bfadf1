#include "ckpt/checkpoint_format.hpp"

#include <xxhash.h>

#include <cstdio>
#include <new>

namespace kiln {

std::string printable(std::string_view text, size_t shown) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (text.size() > shown) out += "...";
  return out;
}

namespace ckpt_format {

struct Checksum::State {
  XXH64_state_t* xxh = XXH64_createState();
  ~State() { XXH64_freeState(xxh); }
};

Checksum::Checksum() : state_(std::make_unique<State>()) {
  if (state_->xxh == nullptr) throw std::bad_alloc();
  XXH64_reset(state_->xxh, 0);
}

Checksum::~Checksum() = default;

void Checksum::update(const void* data, size_t size) { XXH64_update(state_->xxh, data, size); }

uint64_t Checksum::digest() const { return XXH64_digest(state_->xxh); }

}  // namespace ckpt_format
}  // namespace kiln
