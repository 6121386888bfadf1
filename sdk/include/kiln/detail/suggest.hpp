// kiln/detail/suggest.hpp — "did you mean" for misspelt keys and values: the
// one implementation, shared by the host's manifest checks (runtime/config/)
// and the SDK's plugin config checks. Header-only, standard library only.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::detail {

// Levenshtein distance; keys are short, so the quadratic cost does not matter.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The closest candidate within a distance that still reads as a typo, or "".
inline std::string closest(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, key.size() / 3) + 1;
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(key, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

// " (did you mean 'x'?)": the one wording of every suggestion.
inline std::string did_you_mean_hint(std::string_view candidate) {
  return " (did you mean '" + std::string(candidate) + "'?)";
}

// " (did you mean 'x'?)" or "".
inline std::string did_you_mean(std::string_view key, const std::vector<std::string>& candidates) {
  const std::string best = closest(key, candidates);
  return best.empty() ? std::string() : did_you_mean_hint(best);
}

// A suggestion for a misspelt value out of a closed set of lower-case names:
// a case-insensitive match first ("AdamW" for "adamw"), then the nearest by
// edit distance, then a name of 3 or more characters that one starts with
// ("warning" for "warn", "cos" for "cosine"); "" when none reads as meant.
inline std::string did_you_mean_choice(std::string_view given, const std::vector<std::string>& candidates) {
  std::string folded(given);
  for (char& c : folded) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& candidate : candidates) {
    if (folded == candidate) return did_you_mean_hint(candidate);
  }
  std::string hint = did_you_mean(given, candidates);
  if (hint.empty() && folded.size() >= 3) {
    for (const auto& candidate : candidates) {
      if (candidate.size() >= 3 && (folded.compare(0, candidate.size(), candidate) == 0 ||
                                    candidate.compare(0, folded.size(), folded) == 0)) {
        return did_you_mean_hint(candidate);
      }
    }
  }
  return hint;
}

}  // namespace kiln::detail
