// Optimizer parameter groups: which trainable parameter goes into which
// group, chosen by [[optimizer.groups]] glob patterns over the parameter
// names the model reports, each group with its options; and the text a
// checkpoint keeps of them, so that a resumed run is held to the same
// groups. No LibTorch here: names in, indices out.
//
// A parameter goes to the first group (in manifest order) with a pattern
// that matches its name; parameters no group matches form the default group,
// with [optimizer]'s options. The default group comes first in the
// optimizer, then the manifest's groups in order.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "config/manifest.hpp"

namespace kiln {

struct ParamGroup {
  std::string label;               // "optimizer" (the default group) or "optimizer.groups[i]"
  OptimizerConfig options;         // [optimizer]'s, with the group's own in their place
  std::vector<std::string> match;  // the group's patterns; empty for the default group
  std::vector<std::size_t> members;  // indices into the trainable parameters, ascending
};

// Shell-style glob over a whole name: `*` any run of characters (dots
// included), `?` one character, `[abc]`, `[a-z]`, `[!abc]` one of a set.
bool glob_match(const std::string& pattern, const std::string& name);

// The groups for a model whose parameters are `names` (all of them, in the
// model's order), `trainable[i]` saying whether names[i] is trained. Members
// index the trainable parameters in that order (the optimizer's list). The
// default group is left out when every trainable parameter is in a group.
// Throws InputError naming the group's key (`optimizer.groups[1].match`) for
// a pattern that matches no parameter of the model (listing its parameter
// names), and for a group left with no trainable parameter.
std::vector<ParamGroup> plan_param_groups(const OptimizerConfig& config, const std::vector<std::string>& names,
                                          const std::vector<bool>& trainable, const std::string& model_id);

// The groups as a checkpoint keeps them: the optimizer's name, then each
// group's label, patterns, parameter names and the options its optimizer
// reads, one "field value" line each.
std::string describe_param_groups(const std::vector<ParamGroup>& groups,
                                  const std::vector<std::string>& trainable_names);

// The first difference between a checkpoint's description (`saved`) and the
// live run's, as a phrase naming the key ("optimizer.groups[0].lr is 0.1 in
// the checkpoint but 0.01 in the manifest"); nullopt when they agree.
std::optional<std::string> param_groups_difference(const std::string& saved, const std::string& live);

}  // namespace kiln
