// torchvision's ImageFolder convention: root/<class>/<...>/<file>. Classes
// are the sub-directories of root, sorted by name (byte order, which is
// Python's code-point order for UTF-8 names); a class's files are found
// recursively, following symbolic links, sorted as os.walk + sorted() lists
// them (by directory, then name), and kept when their extension is
// .jpg/.jpeg/.png (any case). No LibTorch here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln_image {

struct FolderSample {
  std::string path;  // relative to the root, with '/' separators: "cat/001.jpg"
  int64_t label = 0;
};

struct Folder {
  std::filesystem::path root;
  std::vector<std::string> classes;  // sorted
  std::vector<FolderSample> samples;
  int64_t other_files = 0;           // files skipped for their extension
  std::string an_other_file;         // one of them, for the log line
};

// Lists `root`. With `classes` given (a val or test folder read with train's
// classes), each sub-directory must be one of them and keeps train's label;
// one missing is allowed. Throws FolderError (one line, naming the folder).
class FolderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
Folder list_folder(const std::filesystem::path& root, const std::vector<std::string>* classes = nullptr);

}  // namespace kiln_image
