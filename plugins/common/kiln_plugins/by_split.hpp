// The data a split reads, for data modules that keep train, val and test
// apart and serve test's data for predict too.
#pragma once

#include <stdexcept>
#include <string>

#include "kiln/plugin.hpp"

namespace kiln_plugins {

template <class T>
const T& by_split(kiln::Split split, const T& train, const T& val, const T& test) {
  switch (split) {
    case kiln::Split::train: return train;
    case kiln::Split::val: return val;
    case kiln::Split::test:
    case kiln::Split::predict: return test;
  }
  throw std::invalid_argument("unknown split " + std::to_string(static_cast<int>(split)));
}

}  // namespace kiln_plugins
