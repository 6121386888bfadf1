// The start-up agreement's comparison: every rank describes what it runs
// (manifest, plugin builds, parameter shapes) as named facts; the host
// gathers all ranks' descriptions and names the first difference. No
// LibTorch, no process group here, so it is unit-tested directly.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// (what, text) pairs, compared in order and line by line.
using Facts = std::vector<std::pair<std::string, std::string>>;

std::string encode_facts(const Facts& facts);

// nullopt when every rank's encoded facts equal rank 0's; else one line:
// "ranks 0 and 2 differ in their model parameters: rank 0 has 'fc1.weight
// [256,784] Float', rank 2 has 'fc1.weight [128,784] Float'; ...".
std::optional<std::string> first_difference(const std::vector<std::string>& encoded_per_rank);

// A digest of a file's bytes (XXH64, hex): two builds of one plugin differ
// even when their id and version agree.
std::string file_digest(const std::filesystem::path& file);

}  // namespace kiln
