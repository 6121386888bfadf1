// The runtime's folders form a one-way graph: every `#include "a/b.hpp"` of
// a file under runtime/ is an edge from the file's folder to the included
// file's, and no folder may reach itself again (a cycle between folders is
// what made a checkpoint's path run ckpt -> train -> ckpt -> train). The
// graph docs/architecture.md draws ("```folders") must be this one: the test
// keeps the picture true.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_process.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct Edge {
  std::string file, included;  // one include that makes the edge (for messages)
};
using Graph = std::map<std::string, std::map<std::string, Edge>>;  // folder -> folder -> an include

std::string folder_of(const fs::path& relative) { return relative.parent_path().generic_string(); }

Graph include_graph(const fs::path& root) {
  Graph graph;
  const std::regex include(R"(^\s*#\s*include\s+\"([^\"]+)\")");
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".hpp" && ext != ".cpp" && ext != ".h")) continue;
    const fs::path file = fs::relative(entry.path(), root);
    const std::string from = folder_of(file);
    graph[from];  // every folder is a node, with edges or without
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const fs::path included = m[1].str();
      if (!fs::exists(root / included)) continue;  // the SDK's, a library's
      const std::string to = folder_of(included);
      if (to != from) graph[from].emplace(to, Edge{file.generic_string(), included.generic_string()});
    }
  }
  return graph;
}

// A path from `from` back to itself, or empty.
std::vector<std::string> cycle_through(const Graph& graph, const std::string& from) {
  std::vector<std::string> path{from};
  std::set<std::string> seen;
  std::function<bool(const std::string&)> reach = [&](const std::string& at) {
    const auto it = graph.find(at);
    if (it == graph.end()) return false;
    for (const auto& [to, edge] : it->second) {
      path.push_back(to);
      if (to == from) return true;
      if (seen.insert(to).second && reach(to)) return true;
      path.pop_back();
    }
    return false;
  };
  return reach(from) ? path : std::vector<std::string>{};
}

// docs/architecture.md's "```folders" block: lines "a -> b, c" ("a ->" for
// a folder that includes no other).
std::map<std::string, std::set<std::string>> documented_graph() {
  std::ifstream in(test::source_dir() / "docs" / "architecture.md");
  std::map<std::string, std::set<std::string>> out;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "```folders") {
      inside = true;
      continue;
    }
    if (!inside) continue;
    if (line == "```") break;
    const size_t arrow = line.find(" ->");
    if (arrow == std::string::npos) continue;
    std::set<std::string>& to = out[line.substr(0, arrow)];
    std::istringstream rest(line.substr(arrow + 3));
    for (std::string name; std::getline(rest, name, ',');) {
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      if (!name.empty()) to.insert(name);
    }
  }
  return out;
}

TEST(FolderGraph, TheRuntimesFoldersIncludeEachOtherOneWayOnly) {
  const Graph graph = include_graph(test::source_dir() / "runtime");
  ASSERT_GT(graph.size(), 10u);
  for (const auto& [folder, edges] : graph) {
    const std::vector<std::string> cycle = cycle_through(graph, folder);
    if (cycle.empty()) continue;
    std::string shown;
    for (size_t i = 0; i + 1 < cycle.size(); ++i) {
      const Edge& e = graph.at(cycle[i]).at(cycle[i + 1]);
      shown += "\n  " + cycle[i] + " -> " + cycle[i + 1] + ": " + e.file + " includes \"" + e.included + "\"";
    }
    ADD_FAILURE() << "runtime/" << folder << " reaches itself again:" << shown;
  }
}

TEST(FolderGraph, ArchitectureDrawsTheGraphTheIncludesMake) {
  const Graph graph = include_graph(test::source_dir() / "runtime");
  std::map<std::string, std::set<std::string>> actual;
  std::string block;
  for (const auto& [folder, edges] : graph) {
    std::set<std::string>& to = actual[folder];
    std::string line = folder + " ->";
    for (const auto& [target, edge] : edges) {
      to.insert(target);
      line += (to.size() == 1 ? " " : ", ") + target;
    }
    block += line + "\n";
  }
  EXPECT_EQ(documented_graph(), actual) << "docs/architecture.md's ```folders block should read:\n" << block;
}

}  // namespace
}  // namespace kiln
