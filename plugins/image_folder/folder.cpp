#include "folder.hpp"

#include <algorithm>
#include <cctype>
#include <system_error>
#include <utility>

#include "kiln_plugins/one_line.hpp"

namespace kiln_image {

namespace fs = std::filesystem;

namespace {

bool is_image_name(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

std::string shown(const fs::path& p) { return "'" + kiln_plugins::one_line(p.string()) + "'"; }

// The files under `dir` as sorted(os.walk(dir, followlinks=True)) yields
// them: directories by their path string ('.' sorts before '/', so "a.b"
// comes before "a/c"), each one's files sorted by name.
void walk(const fs::path& dir, const std::string& rel, std::vector<std::pair<std::string, std::vector<std::string>>>& out,
          int depth) {
  if (depth > 64) throw FolderError(shown(dir) + ": directories nested over 64 deep (a symbolic link loop?)");
  std::error_code ec;
  std::vector<std::string> names, dirs;
  for (fs::directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (it->is_directory(type_ec))
      dirs.push_back(name);
    else
      names.push_back(name);
  }
  if (ec) throw FolderError(shown(dir) + ": cannot be listed: " + ec.message());
  std::sort(names.begin(), names.end());
  out.emplace_back(rel, std::move(names));
  for (const std::string& d : dirs) walk(dir / d, rel + "/" + d, out, depth + 1);
}

std::vector<std::string> files_under(const fs::path& class_dir, const std::string& class_name) {
  std::vector<std::pair<std::string, std::vector<std::string>>> dirs;
  walk(class_dir, class_name, dirs, 0);
  std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> files;
  for (const auto& [rel, names] : dirs)
    for (const std::string& n : names) files.push_back(rel + "/" + n);
  return files;
}

}  // namespace

Folder list_folder(const fs::path& root, const std::vector<std::string>* classes) {
  Folder folder;
  folder.root = root;
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw FolderError(shown(root) + (fs::exists(root, ec) ? ": not a directory" : ": no such directory") +
                      "; an image folder is <root>/<class>/<image files>");
  std::vector<std::string> found;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) found.push_back(it->path().filename().string());
  }
  if (ec) throw FolderError(shown(root) + ": cannot be listed: " + ec.message());
  std::sort(found.begin(), found.end());
  if (found.empty())
    throw FolderError(shown(root) + ": has no class sub-directories; an image folder is <root>/<class>/<image files>");
  if (classes) {
    for (const std::string& c : found)
      if (!std::binary_search(classes->begin(), classes->end(), c))
        throw FolderError(shown(root / c) + ": class '" + kiln_plugins::one_line(c) +
                          "' is not one of train's classes (each split's classes are train's, by name)");
    folder.classes = *classes;
  } else {
    folder.classes = found;
  }
  for (const std::string& c : found) {
    const int64_t label =
        std::lower_bound(folder.classes.begin(), folder.classes.end(), c) - folder.classes.begin();
    std::vector<std::string> files = files_under(root / c, c);
    size_t images = 0;
    for (std::string& f : files) {
      if (is_image_name(f)) {
        folder.samples.push_back(FolderSample{std::move(f), label});
        ++images;
      } else {
        if (folder.other_files++ == 0) folder.an_other_file = f;
      }
    }
    if (images == 0)
      throw FolderError(shown(root / c) + ": class '" + kiln_plugins::one_line(c) +
                        "' has no .jpg, .jpeg or .png file (torchvision refuses it too); remove the directory or add images");
  }
  return folder;
}

}  // namespace kiln_image
