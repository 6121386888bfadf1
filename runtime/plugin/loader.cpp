#include "plugin/loader.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <vector>

#include <boost/dll/shared_library.hpp>
#include <torch/version.h>

#include "plugin/elf_check.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

// ABI 1.0's frozen sizes are the floor (abi.h): a struct smaller than that
// predates the ABI or is corrupt, while a plugin built against 1.0 keeps
// loading in this 1.x host. Fields appended by later minors are read only
// when the plugin's struct_size says they exist (KILN_HAS_FIELD).
constexpr size_t kMinEntrySize = KILN_ENTRY_STRUCT_SIZE_1_0;
constexpr size_t kMinDescriptorSize = KILN_DESCRIPTOR_STRUCT_SIZE_1_0;
constexpr size_t kMinLifecycleSize = KILN_LIFECYCLE_STRUCT_SIZE_1_0;

size_t min_hooks_size(kiln_plugin_kind kind) {
  switch (kind) {
    case KILN_KIND_MODEL: return KILN_MODEL_HOOKS_STRUCT_SIZE_1_0;
    case KILN_KIND_DATA_MODULE: return KILN_DATA_HOOKS_STRUCT_SIZE_1_0;
    case KILN_KIND_CALLBACK: return KILN_CALLBACK_HOOKS_STRUCT_SIZE_1_0;
    default: return 0;
  }
}

std::string major_minor(const std::string& version) {
  const auto first = version.find('.');
  if (first == std::string::npos) return version;
  const auto second = version.find('.', first + 1);
  return version.substr(0, second);
}

// The DT_NEEDED entries of a 64-bit ELF file, read from its section headers
// without loading it; empty when the file is not one or is malformed.
std::vector<std::string> needed_libraries(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto fits = [&](uint64_t offset, uint64_t size) { return offset <= bytes.size() && size <= bytes.size() - offset; };
  Elf64_Ehdr header;
  if (!fits(0, sizeof header)) return {};
  std::memcpy(&header, bytes.data(), sizeof header);
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_shentsize != sizeof(Elf64_Shdr)) return {};
  const auto section = [&](size_t i, Elf64_Shdr& out) {
    const uint64_t at = header.e_shoff + i * sizeof(Elf64_Shdr);
    if (i >= header.e_shnum || !fits(at, sizeof out)) return false;
    std::memcpy(&out, bytes.data() + at, sizeof out);
    return true;
  };
  std::vector<std::string> needed;
  Elf64_Shdr dynamic, strings;
  for (size_t i = 0; section(i, dynamic); ++i) {
    if (dynamic.sh_type != SHT_DYNAMIC || !section(dynamic.sh_link, strings)) continue;
    if (!fits(dynamic.sh_offset, dynamic.sh_size) || !fits(strings.sh_offset, strings.sh_size)) return {};
    for (uint64_t at = 0; at + sizeof(Elf64_Dyn) <= dynamic.sh_size; at += sizeof(Elf64_Dyn)) {
      Elf64_Dyn entry;
      std::memcpy(&entry, bytes.data() + dynamic.sh_offset + at, sizeof entry);
      if (entry.d_tag == DT_NULL) break;
      if (entry.d_tag != DT_NEEDED || entry.d_un.d_val >= strings.sh_size) continue;
      const char* name = bytes.data() + strings.sh_offset + entry.d_un.d_val;
      needed.emplace_back(name, strnlen(name, strings.sh_size - entry.d_un.d_val));
    }
  }
  return needed;
}

// "libc10.so.1.13" -> "libc10.so"
std::string so_stem(const std::string& name) {
  const auto at = name.find(".so");
  return at == std::string::npos ? name : name.substr(0, at + 3);
}

// This process's LibTorch libraries by stem: {"libc10.so": "libc10.so.1.13"}.
const std::map<std::string, std::string>& host_torch_libraries() {
  static const std::map<std::string, std::string> libraries = [] {
    std::map<std::string, std::string> found;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          const std::string name = std::filesystem::path(info->dlpi_name ? info->dlpi_name : "").filename().string();
          const std::string stem = so_stem(name);
          if (stem == "libc10.so" || stem == "libtorch_cpu.so")
            static_cast<std::map<std::string, std::string>*>(out)->emplace(stem, name);
          return 0;
        },
        &found);
    return found;
  }();
  return libraries;
}

}  // namespace

const char* kind_name(kiln_plugin_kind kind) {
  switch (kind) {
    case KILN_KIND_MODEL: return "model";
    case KILN_KIND_DATA_MODULE: return "data module";
    case KILN_KIND_CALLBACK: return "callback";
    default: return "unknown kind";
  }
}

std::string host_torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
}

// One dlopen'ed shared object and its validated entry table.
class PluginLibrary {
 public:
  PluginLibrary(boost::dll::shared_library library, const kiln_entry* entry)
      : library_(std::make_unique<boost::dll::shared_library>(std::move(library))), entry_(entry) {
    for (size_t i = 0; i < entry_->descriptor_count; ++i)
      if (entry_->descriptors[i]->torch_version != nullptr) links_torch_ = true;
  }
  ~PluginLibrary() {
    // Unloading a library linked to LibTorch crashes in LibTorch's static
    // destructors (pytorch #61111, #46171): keep it mapped until exit.
    if (links_torch_) (void)library_.release();
  }
  const kiln_entry& entry() const { return *entry_; }

 private:
  std::unique_ptr<boost::dll::shared_library> library_;
  const kiln_entry* entry_;
  bool links_torch_ = false;
};

namespace {

// Refuses what must not reach dlopen: a missing or odd file, one cut short
// (an interrupted copy would otherwise be a SIGBUS inside dlopen,
// plugin/elf_check.hpp), one linked to another LibTorch.
void check_before_loading(const std::filesystem::path& absolute, const std::string& who) {
  std::error_code ec;
  if (!std::filesystem::exists(absolute, ec))
    throw InputError(who + ": plugin file not found; build it or fix its `path`");
  if (!std::filesystem::is_regular_file(absolute, ec))
    throw InputError(who + ": not a regular file; `path` must name a plugin shared object");
  check_elf_shared_object(absolute, who);
  // A plugin linked to another LibTorch's libraries (other file names, as
  // Debian's libc10.so.1.13 and a wheel's libc10.so) would load that LibTorch
  // beside this one, and the two crash in their static initialisers before
  // the plugin's descriptor could say which it was built against: refuse it
  // unopened. (Same names: the descriptor's torch_version check.)
  for (const auto& name : needed_libraries(absolute)) {
    const auto host = host_torch_libraries().find(so_stem(name));
    if (host != host_torch_libraries().end() && host->second != name)
      throw InputError(who + ": was built against another LibTorch: it links " + name + ", but this kiln uses " +
                       host->second + " (LibTorch " + host_torch_version() +
                       "); rebuild the plugin with the same LibTorch (CMAKE_PREFIX_PATH)");
  }
}

boost::dll::shared_library load_library(const std::filesystem::path& absolute, const std::string& who) {
  boost::dll::shared_library library;
  boost::dll::fs::error_code load_error;
  // rtld_local: a plugin's symbols never satisfy another's; rtld_now: an
  // unresolved symbol fails here, not in the middle of training.
  library.load(absolute, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, load_error);
  if (load_error || !library.is_loaded()) {
    // Boost reports only an errno; dlopen's own text names the missing symbol or library.
    std::string detail = load_error.message();
    if (void* handle = ::dlopen(absolute.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      ::dlclose(handle);
    } else if (const char* text = ::dlerror()) {
      detail = text;
    }
    throw InputError(who + ": cannot load shared object: " + detail);
  }
  return library;
}

// The library's entry table, checked against ABI 1.0's floor and this
// host's major version.
const kiln_entry* checked_entry(const boost::dll::shared_library& library, const std::string& who) {
  if (!library.has(KILN_ENTRY_SYMBOL))
    throw InputError(who + ": exports no '" KILN_ENTRY_SYMBOL
                     "'; not a kiln plugin (export one with KILN_EXPORT_PLUGINS)");
  auto entry_fn = library.get<const kiln_entry*()>(KILN_ENTRY_SYMBOL);
  const kiln_entry* entry = entry_fn();
  if (entry == nullptr) throw InputError(who + ": " KILN_ENTRY_SYMBOL "() returned NULL");
  if (entry->struct_size < kMinEntrySize)
    throw InputError(who + ": kiln_entry.struct_size is " + std::to_string(entry->struct_size) +
                     ", smaller than ABI 1.0's " + std::to_string(kMinEntrySize) +
                     "; rebuild the plugin against this kiln's SDK");
  if (entry->abi_major != KILN_ABI_VERSION_MAJOR)
    throw InputError(who + ": built for kiln ABI " + std::to_string(entry->abi_major) + "." +
                     std::to_string(entry->abi_minor) + ", this kiln speaks ABI " +
                     std::to_string(KILN_ABI_VERSION_MAJOR) + "." + std::to_string(KILN_ABI_VERSION_MINOR) +
                     "; rebuild the plugin against this kiln's SDK");
  if (entry->descriptor_count == 0 || entry->descriptors == nullptr)
    throw InputError(who + ": the plugin entry lists no plugins");
  return entry;
}

// The hooks a plugin of its kind cannot do without, present in a table at
// least as large as ABI 1.0's.
void check_hooks(const kiln_descriptor& d, const std::string& named) {
  const size_t hooks_size = d.hooks ? *static_cast<const size_t*>(d.hooks) : 0;
  if (hooks_size < min_hooks_size(d.kind))
    throw InputError(named + ": " + kind_name(d.kind) + " hooks table missing or struct_size " +
                     std::to_string(hooks_size) + " smaller than ABI 1.0's " +
                     std::to_string(min_hooks_size(d.kind)) + "; rebuild the plugin");
  if (d.torch_version != nullptr && major_minor(d.torch_version) != host_torch_version())
    throw InputError(named + " was built against LibTorch " + d.torch_version +
                     ", but this kiln uses LibTorch " + host_torch_version() +
                     "; rebuild the plugin with the same LibTorch (CMAKE_PREFIX_PATH)");
  if (d.kind == KILN_KIND_MODEL) {
    const auto* h = static_cast<const kiln_model_hooks*>(d.hooks);
    if (!h->parameters) throw InputError(named + ": a model must implement 'parameters'");
  } else if (d.kind == KILN_KIND_DATA_MODULE) {
    const auto* h = static_cast<const kiln_data_hooks*>(d.hooks);
    if (!h->length || !h->get_batch)
      throw InputError(named + ": a data module must implement 'length' and 'get_batch'");
  }
}

// Descriptor #i of the entry table; `ids` holds the ids of those before it.
void check_descriptor(const kiln_descriptor* d, size_t i, const std::string& who, std::set<std::string>& ids) {
  const std::string at = who + ": descriptor #" + std::to_string(i);
  if (d == nullptr) throw InputError(at + " is NULL");
  if (d->struct_size < kMinDescriptorSize)
    throw InputError(at + ": kiln_descriptor.struct_size is " + std::to_string(d->struct_size) +
                     ", smaller than ABI 1.0's " + std::to_string(kMinDescriptorSize) +
                     "; rebuild the plugin against this kiln's SDK");
  if (d->id == nullptr || *d->id == '\0') throw InputError(at + " has no id");
  const std::string id = d->id;
  if (!ids.insert(id).second) throw InputError(who + ": plugin id '" + id + "' is listed twice");
  const std::string named = who + ": plugin '" + id + "'";
  if (min_hooks_size(d->kind) == 0)
    throw InputError(named + " has unknown kind " + std::to_string(d->kind));
  if (d->lifecycle == nullptr || d->lifecycle->struct_size < kMinLifecycleSize)
    throw InputError(named + ": kiln_lifecycle missing or struct_size too small; rebuild the plugin");
  if (d->lifecycle->create == nullptr || d->lifecycle->destroy == nullptr)
    throw InputError(named + ": kiln_lifecycle lacks create or destroy, which are required");
  check_hooks(*d, named);
}

}  // namespace

Loader::Loader() = default;
Loader::~Loader() = default;

std::shared_ptr<PluginLibrary> Loader::open(const std::filesystem::path& path, const std::string& context) {
  const std::filesystem::path absolute = std::filesystem::absolute(path).lexically_normal();
  if (auto it = libraries_.find(absolute); it != libraries_.end()) return it->second;
  const std::string who = absolute.string() + " (" + context + ")";
  check_before_loading(absolute, who);
  boost::dll::shared_library library = load_library(absolute, who);
  const kiln_entry* entry = checked_entry(library, who);
  std::set<std::string> ids;
  for (size_t i = 0; i < entry->descriptor_count; ++i) check_descriptor(entry->descriptors[i], i, who, ids);
  auto loaded = std::make_shared<PluginLibrary>(std::move(library), entry);
  libraries_.emplace(absolute, loaded);
  return loaded;
}

LoadedPlugin Loader::load(const std::filesystem::path& path, const std::string& id,
                          kiln_plugin_kind expected_kind, const std::string& slot,
                          const std::string& context) {
  auto library = open(path, context);
  const kiln_entry& entry = library->entry();
  const std::string who = std::filesystem::absolute(path).lexically_normal().string() + " (" + context + ")";

  const kiln_descriptor* chosen = nullptr;
  std::string listed;
  for (size_t i = 0; i < entry.descriptor_count; ++i) {
    const kiln_descriptor* d = entry.descriptors[i];
    listed += (i ? ", " : "") + std::string(d->id);
    if (!id.empty() && id == d->id) chosen = d;
  }
  if (id.empty()) {
    if (entry.descriptor_count > 1)
      throw InputError(who + ": the library holds several plugins (" + listed + "); choose one with `id`");
    chosen = entry.descriptors[0];
  } else if (chosen == nullptr) {
    throw InputError(who + ": no plugin with id '" + id + "' (the library holds: " + listed + ")");
  }
  if (chosen->kind != expected_kind)
    throw InputError(who + ": [" + slot + "] needs a " + kind_name(expected_kind) + ", but '" +
                     chosen->id + "' is a " + kind_name(chosen->kind));
  return LoadedPlugin{std::move(library), chosen, std::filesystem::absolute(path), slot, entry.abi_minor};
}

void check_unique_ids(const std::vector<const LoadedPlugin*>& plugins, const std::string& manifest) {
  std::map<std::string, std::string> seen;
  for (const LoadedPlugin* p : plugins) {
    auto [it, inserted] = seen.emplace(p->id(), p->slot);
    if (!inserted)
      throw InputError(manifest + " [" + p->slot + "]: plugin id '" + p->id() + "' is already used by [" +
                       it->second + "]; each plugin of a run needs its own id");
  }
}

PluginReport describe_plugin(const kiln_descriptor& d, const kiln_entry& entry) {
  PluginReport r;
  r.id = d.id;
  r.name = d.name ? d.name : "";
  r.version = d.version ? d.version : "";
  r.description = d.description ? d.description : "";
  r.kind = kind_name(d.kind);
  r.torch_version = d.torch_version ? d.torch_version : "none";
  r.abi_major = entry.abi_major;
  r.abi_minor = entry.abi_minor;
  r.flags = d.flags;
  auto add = [&](const char* name, const void* fn) {
    if (fn) r.hooks.emplace_back(name);
  };
  const kiln_lifecycle& l = *d.lifecycle;
  add("create", reinterpret_cast<const void*>(l.create));
  add("setup", reinterpret_cast<const void*>(l.setup));
  add("teardown", reinterpret_cast<const void*>(l.teardown));
  add("on_exception", reinterpret_cast<const void*>(l.on_exception));
  add("state_save", reinterpret_cast<const void*>(l.state_save));
  add("state_load", reinterpret_cast<const void*>(l.state_load));
  add("destroy", reinterpret_cast<const void*>(l.destroy));
  if (d.kind == KILN_KIND_MODEL) {
    const auto& h = *static_cast<const kiln_model_hooks*>(d.hooks);
    add("parameters", reinterpret_cast<const void*>(h.parameters));
    add("training_step", reinterpret_cast<const void*>(h.training_step));
    add("validation_step", reinterpret_cast<const void*>(h.validation_step));
    add("test_step", reinterpret_cast<const void*>(h.test_step));
    add("predict_step", reinterpret_cast<const void*>(h.predict_step));
    if (KILN_HAS_FIELD(&h, kiln_model_hooks, on_epoch_end))
      add("on_epoch_end", reinterpret_cast<const void*>(h.on_epoch_end));
  } else if (d.kind == KILN_KIND_DATA_MODULE) {
    const auto& h = *static_cast<const kiln_data_hooks*>(d.hooks);
    add("prepare_data", reinterpret_cast<const void*>(h.prepare_data));
    add("length", reinterpret_cast<const void*>(h.length));
    add("get_batch", reinterpret_cast<const void*>(h.get_batch));
    if (KILN_HAS_FIELD(&h, kiln_data_hooks, get_batch_seeded))
      add("get_batch_seeded", reinterpret_cast<const void*>(h.get_batch_seeded));
  } else {
    const auto& h = *static_cast<const kiln_callback_hooks*>(d.hooks);
    add("on_fit_start", reinterpret_cast<const void*>(h.on_fit_start));
    add("on_fit_end", reinterpret_cast<const void*>(h.on_fit_end));
    add("on_train_epoch_start", reinterpret_cast<const void*>(h.on_train_epoch_start));
    add("on_train_epoch_end", reinterpret_cast<const void*>(h.on_train_epoch_end));
    add("on_train_batch_end", reinterpret_cast<const void*>(h.on_train_batch_end));
    add("on_validation_start", reinterpret_cast<const void*>(h.on_validation_start));
    add("on_validation_end", reinterpret_cast<const void*>(h.on_validation_end));
    add("on_test_end", reinterpret_cast<const void*>(h.on_test_end));
    if (KILN_HAS_FIELD(&h, kiln_callback_hooks, on_epoch_collected))
      add("on_epoch_collected", reinterpret_cast<const void*>(h.on_epoch_collected));
  }
  return r;
}

std::vector<PluginReport> Loader::inspect(const std::filesystem::path& path) {
  auto library = open(path, "inspect");
  const kiln_entry& entry = library->entry();
  std::vector<PluginReport> out;
  for (size_t i = 0; i < entry.descriptor_count; ++i) out.push_back(describe_plugin(*entry.descriptors[i], entry));
  return out;
}

}  // namespace kiln
