#include "optim/param_groups.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "config/manifest_schema.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

constexpr std::size_t kNamesShown = 20;

// "a, b, c" — at most kNamesShown names, then how many more.
std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kNamesShown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kNamesShown) out += ", ... (" + std::to_string(names.size() - kNamesShown) + " more)";
  return out;
}

std::string patterns_text(const std::vector<std::string>& patterns) {
  std::string out;
  for (const auto& p : patterns) out += (out.empty() ? "" : ", ") + ("'" + p + "'");
  return out;
}

// An option's value as the manifest writes it (0.001, [0.9, 0.999], true).
std::string option_text(const OptimizerConfig& options, const std::string& key) {
  Manifest m;
  m.optimizer = options;
  return find_key_schema("optimizer", key)->show(m);
}

struct DescribedGroup {
  std::string label;
  std::vector<std::pair<std::string, std::string>> fields;  // in the order written
};

struct Description {
  std::string optimizer;
  std::vector<DescribedGroup> groups;
};

Description parse(const std::string& text) {
  Description d;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t space = line.find(' ');
    const std::string field = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (field == "optimizer") {
      d.optimizer = value;
    } else if (field == "group") {
      d.groups.push_back({value, {}});
    } else if (!d.groups.empty()) {
      d.groups.back().fields.emplace_back(field, value);
    }
  }
  return d;
}

const DescribedGroup* find_group(const Description& d, const std::string& label) {
  for (const auto& g : d.groups)
    if (g.label == label) return &g;
  return nullptr;
}

std::string field_value(const DescribedGroup& g, const std::string& field) {
  for (const auto& [f, v] : g.fields)
    if (f == field) return v;
  return "(not set)";
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::vector<ParamGroup> plan_param_groups(const OptimizerConfig& config, const std::vector<std::string>& names,
                                          const std::vector<bool>& trainable, const std::string& model_id) {
  ParamGroup fallback{"optimizer", config, {}, {}};
  fallback.options.groups.clear();
  std::vector<ParamGroup> groups;
  for (std::size_t g = 0; g < config.groups.size(); ++g) {
    const OptimizerGroupConfig& spec = config.groups[g];
    const std::string label = "optimizer.groups[" + std::to_string(g) + "]";
    for (const auto& pattern : spec.match) {
      if (std::none_of(names.begin(), names.end(), [&](const std::string& n) { return glob_match(pattern, n); }))
        throw InputError(spec.where + ": " + label + ".match: '" + pattern + "' matches no parameter of model '" +
                         model_id + "' (its parameters: " + name_list(names) + ")");
    }
    groups.push_back(ParamGroup{label, config.for_group(spec), spec.match, {}});
  }
  std::size_t index = 0;  // among the trainable parameters
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!trainable[i]) continue;
    ParamGroup* home = &fallback;
    for (auto& group : groups) {
      if (std::any_of(group.match.begin(), group.match.end(),
                      [&](const std::string& p) { return glob_match(p, names[i]); })) {
        home = &group;
        break;
      }
    }
    home->members.push_back(index++);
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].members.empty()) continue;
    const OptimizerGroupConfig& spec = config.groups[g];
    std::vector<std::string> matched;
    for (const auto& n : names)
      if (std::any_of(spec.match.begin(), spec.match.end(), [&](const std::string& p) { return glob_match(p, n); }))
        matched.push_back(n);
    throw InputError(spec.where + ": " + groups[g].label + ".match: " + patterns_text(spec.match) +
                     " leaves the group no parameter to train: what it matches (" + name_list(matched) +
                     ") is frozen or taken by an earlier group (the first group that matches a parameter takes it); "
                     "narrow the earlier group's patterns or remove this group");
  }
  if (!fallback.members.empty()) groups.insert(groups.begin(), std::move(fallback));
  return groups;
}

std::string describe_param_groups(const std::vector<ParamGroup>& groups,
                                  const std::vector<std::string>& trainable_names) {
  std::string out;
  if (!groups.empty()) out += "optimizer " + option_name(groups.front().options.name) + "\n";
  for (const auto& g : groups) {
    out += "group " + g.label + "\n";
    if (!g.match.empty()) out += "match " + patterns_text(g.match) + "\n";
    std::vector<std::string> members;
    for (std::size_t i : g.members) members.push_back(trainable_names.at(i));
    std::string joined;
    for (const auto& n : members) joined += (joined.empty() ? "" : ", ") + n;
    out += "parameters " + joined + "\n";
    for (const auto& key : optimizer_option_keys(g.options.name)) out += key + " " + option_text(g.options, key) + "\n";
  }
  return out;
}

std::optional<std::string> param_groups_difference(const std::string& saved_text, const std::string& live_text) {
  const Description saved = parse(saved_text), live = parse(live_text);
  if (saved.optimizer != live.optimizer)
    return "optimizer.name is '" + saved.optimizer + "' in the checkpoint but '" + live.optimizer + "' in the manifest";
  for (const auto& g : saved.groups) {
    if (find_group(live, g.label)) continue;
    return g.label == "optimizer"
               ? "the checkpoint has a default group (parameters no [[optimizer.groups]] entry matches: " +
                     field_value(g, "parameters") + ") but the manifest's groups match every parameter"
               : "the checkpoint has " + g.label + " (match " + field_value(g, "match") +
                     ") but the manifest has no such group";
  }
  for (const auto& g : live.groups) {
    if (find_group(saved, g.label)) continue;
    return g.label == "optimizer"
               ? "the manifest leaves parameters to the default group (" + field_value(g, "parameters") +
                     ") but the checkpoint's groups matched every parameter"
               : "the manifest has " + g.label + " (match " + field_value(g, "match") +
                     ") but the checkpoint has no such group";
  }
  // What the manifest says (patterns, then options) before what follows
  // from it (which parameters each group holds).
  for (const std::string pass : {"match", "options", "parameters"}) {
    for (const auto& g : saved.groups) {
      const DescribedGroup& other = *find_group(live, g.label);
      for (const auto& [field, value] : g.fields) {
        const bool in_pass = pass == "options" ? field != "match" && field != "parameters" : field == pass;
        const std::string now = field_value(other, field);
        if (!in_pass || now == value) continue;
        if (field == "parameters")
          return (g.label == "optimizer" ? std::string("the default group") : g.label) + " holds " + value +
                 " in the checkpoint but " + now + " in the manifest";
        return g.label + "." + field + " is " + value + " in the checkpoint but " + now + " in the manifest";
      }
    }
  }
  return std::nullopt;
}

}  // namespace kiln
