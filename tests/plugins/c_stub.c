/* A minimal callback plugin in plain C, compiled several times with one
 * defect each (a STUB_* definition) so the loader tests can check every
 * refusal against a real shared object:
 *   STUB_NO_ENTRY        exports no kiln_plugin_entry
 *   STUB_ABI_MAJOR       claims ABI major 99
 *   STUB_SMALL_STRUCT    kiln_entry.struct_size smaller than ABI 1.0's
 *   STUB_OTHER_TORCH     claims it was built against LibTorch 0.1
 *   STUB_ID              overrides the plugin id (default "test.c_stub")
 *   STUB_ABI_1_0         built against the frozen 1.0 header (tests/abi/v1_0)
 * With no defect it is a valid callback that does nothing. */
#include <stddef.h>

#include "kiln/abi.h"

#ifndef STUB_ID
#define STUB_ID "test.c_stub"
#endif

struct kiln_instance {
  int unused;
};
static struct kiln_instance the_instance;

static kiln_error* stub_create(const kiln_host* host, const char* config, kiln_instance** out) {
  (void)host;
  (void)config;
  *out = &the_instance;
  return NULL;
}

static void stub_destroy(kiln_instance* self) { (void)self; }

static const kiln_lifecycle lifecycle = {sizeof(kiln_lifecycle), stub_create, NULL, NULL, NULL, NULL, NULL, stub_destroy};

#ifdef STUB_ABI_1_0 /* built against tests/abi/v1_0's frozen header: 8 hooks */
static const kiln_callback_hooks hooks = {sizeof(kiln_callback_hooks), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#else
static const kiln_callback_hooks hooks = {sizeof(kiln_callback_hooks), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif

#ifdef STUB_OTHER_TORCH
#define STUB_TORCH "0.1"
#else
#define STUB_TORCH NULL
#endif

static const kiln_descriptor descriptor = {
    sizeof(kiln_descriptor), STUB_ID, "C stub", "1", "a do-nothing callback in C",
    KILN_KIND_CALLBACK, STUB_TORCH, 0, &lifecycle, &hooks};
static const kiln_descriptor* const descriptors[] = {&descriptor};

#ifndef STUB_NO_ENTRY
KILN_EXPORT const kiln_entry* kiln_plugin_entry(void) {
  static const kiln_entry entry = {
#ifdef STUB_SMALL_STRUCT
      sizeof(size_t),
#else
      sizeof(kiln_entry),
#endif
#ifdef STUB_ABI_MAJOR
      99,
#else
      KILN_ABI_VERSION_MAJOR,
#endif
      KILN_ABI_VERSION_MINOR, 1, descriptors};
  return &entry;
}
#else
KILN_EXPORT int kiln_not_an_entry(void) { return descriptors[0] != NULL; }
#endif
