/* The ABI header must stay plain C: this file is compiled with
 * -std=c99 -Wall -Wextra -Werror -pedantic by the test suite. It also checks
 * that the layout rules the header promises hold. */
#include "kiln/abi.h"

typedef char struct_size_comes_first[offsetof(kiln_descriptor, struct_size) == 0 ? 1 : -1];
typedef char host_struct_size_first[offsetof(kiln_host, struct_size) == 0 ? 1 : -1];
typedef char hooks_struct_size_first[offsetof(kiln_model_hooks, struct_size) == 0 &&
                                             offsetof(kiln_data_hooks, struct_size) == 0 &&
                                             offsetof(kiln_callback_hooks, struct_size) == 0
                                         ? 1
                                         : -1];

int kiln_abi_c99_check(const kiln_host* host);
int kiln_abi_c99_check(const kiln_host* host) {
  /* KILN_HAS_FIELD is usable from C. */
  return KILN_HAS_FIELD(host, kiln_host, state_read) ? KILN_ABI_VERSION_MAJOR : 0;
}

/* A struct added after 1.0 has its first layout's size as its floor. */
typedef char batch_request_floor[KILN_BATCH_REQUEST_STRUCT_SIZE_1_4 <= sizeof(kiln_batch_request) &&
                                         KILN_BATCH_REQUEST_STRUCT_SIZE_1_4 > offsetof(kiln_batch_request, sample_seeds)
                                     ? 1
                                     : -1];
