/*
 * example.c_blobs — a kiln data module in plain C99, linked against no
 * LibTorch: it sees only the C ABI (kiln/abi.h) and DLPack.
 *
 * The data are Gaussian blobs: each class has a centroid drawn from N(0, 1)
 * per feature, and a sample of class c is centroid[c] + N(0, I). Sample i has
 * class i % classes. Everything is a pure function of the config.
 *
 * [data]
 * path = "kiln_example_c_blobs"
 * features = 16
 * classes = 4
 * train_size = 2048
 * val_size = 512       # 0 = no val split
 * test_size = 512      # also the predict split
 * seed = 0
 *
 * Batches are "input" float32 [n, features] and "target" int64 [n], each in
 * its own malloc'd buffer that the host wraps without copying
 * (tensor_from_dlpack) and frees through the DLPack deleter.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

#include "kiln/abi.h"

#define PLUGIN_ID "example.c_blobs"

/* ------------------------------------------------------------------------ */
/* Config                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct blobs_config {
  int64_t features;
  int64_t classes;
  int64_t train_size;
  int64_t val_size;
  int64_t test_size;
  int64_t seed;
} blobs_config;

static const blobs_config default_config = {16, 4, 2048, 512, 512, 0};

/* Limits keep every size product far from overflow; memory runs out first. */
static const struct config_key {
  const char* name;
  size_t offset;
  int64_t minimum;
  int64_t maximum;
} config_keys[] = {
    {"features", offsetof(blobs_config, features), 1, INT64_C(1) << 20},
    {"classes", offsetof(blobs_config, classes), 1, INT64_C(1) << 20},
    {"train_size", offsetof(blobs_config, train_size), 0, INT64_C(1) << 30},
    {"val_size", offsetof(blobs_config, val_size), 0, INT64_C(1) << 30},
    {"test_size", offsetof(blobs_config, test_size), 0, INT64_C(1) << 30},
    {"seed", offsetof(blobs_config, seed), INT64_MIN, INT64_MAX},
};

/* An error for the host, which adds the plugin id, hook and rank to it. */
static kiln_error* fail(const kiln_host* host, const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  return host->error_new(host, message);
}

static void warn(const kiln_host* host, const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  host->log(host, KILN_LOG_WARN, message);
}

static const char* skip_blanks(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
  return p;
}

/* One line of the table: `key = integer`, optionally followed by a comment.
 * A full TOML parser is out of scope for an example; every key this module
 * knows is an integer, so other lines are reported and ignored. */
static kiln_error* parse_line(const kiln_host* host, const char* p, const char* end,
                              blobs_config* config) {
  const char* key;
  size_t key_length, i;
  const struct config_key* known = NULL;
  char digits[32];
  size_t n = 0;
  char* stop = NULL;
  long long value;

  p = skip_blanks(p, end);
  if (p == end || *p == '#') return NULL;
  key = p;
  while (p < end && (isalnum((unsigned char)*p) || *p == '_' || *p == '-')) ++p;
  key_length = (size_t)(p - key);
  p = skip_blanks(p, end);
  if (key_length == 0 || p == end || *p != '=') {
    warn(host, "ignoring a config line that is not `key = value`: %.*s", (int)(end - key), key);
    return NULL;
  }
  for (i = 0; i < sizeof config_keys / sizeof config_keys[0]; ++i) {
    if (strlen(config_keys[i].name) == key_length &&
        memcmp(config_keys[i].name, key, key_length) == 0)
      known = &config_keys[i];
  }
  if (known == NULL) {
    warn(host, "ignoring unknown config key '%.*s'", (int)key_length, key);
    return NULL;
  }

  p = skip_blanks(p + 1, end);
  while (p < end && n + 1 < sizeof digits && !isspace((unsigned char)*p) && *p != '#')
    digits[n++] = *p++;
  digits[n] = '\0';
  p = skip_blanks(p, end);
  errno = 0;
  value = n > 0 ? strtoll(digits, &stop, 10) : 0;
  if (n == 0 || *stop != '\0' || errno == ERANGE || (p < end && *p != '#'))
    return fail(host, "'%s' must be an integer (e.g. %s = 16)", known->name, known->name);
  if (value < known->minimum || value > known->maximum)
    return fail(host, "'%s' must be between %lld and %lld, got %lld", known->name,
                (long long)known->minimum, (long long)known->maximum, value);
  *(int64_t*)((char*)config + known->offset) = (int64_t)value;
  return NULL;
}

static kiln_error* parse_config(const kiln_host* host, const char* text, blobs_config* config) {
  while (text != NULL && *text != '\0') {
    const char* end = strchr(text, '\n');
    kiln_error* error;
    if (end == NULL) end = text + strlen(text);
    error = parse_line(host, text, end, config);
    if (error != NULL) return error;
    text = *end != '\0' ? end + 1 : end;
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Deterministic random numbers                                              */
/* ------------------------------------------------------------------------ */

/* splitmix64: tiny, fast and good enough for synthetic data; its output also
 * serves to derive independent stream seeds from the user's seed. */
static uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

typedef struct rng {
  uint64_t state;
  int has_spare;
  double spare;
} rng;

/* Each split draws from its own stream, so resizing one split leaves the
 * others unchanged. */
static rng rng_stream(int64_t seed, uint64_t stream) {
  rng r;
  uint64_t mix = (uint64_t)seed ^ (stream * UINT64_C(0xD1B54A32D192ED03));
  r.state = splitmix64(&mix);
  r.has_spare = 0;
  r.spare = 0.0;
  return r;
}

/* Uniform in (0, 1): never 0, so its logarithm is finite. */
static double rng_uniform(rng* r) {
  return ((double)(splitmix64(&r->state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller, which yields two values per draw. */
static double rng_normal(rng* r) {
  const double two_pi = 6.283185307179586476925286766559;
  double radius, angle;
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  radius = sqrt(-2.0 * log(rng_uniform(r)));
  angle = two_pi * rng_uniform(r);
  r->spare = radius * sin(angle);
  r->has_spare = 1;
  return radius * cos(angle);
}

/* ------------------------------------------------------------------------ */
/* The instance                                                              */
/* ------------------------------------------------------------------------ */

typedef struct split_data {
  int64_t size;
  float* inputs;   /* [size, features], row-major */
  int64_t* labels; /* [size] */
} split_data;

enum { SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST, SPLIT_COUNT };

typedef struct blobs {
  const kiln_host* host;
  blobs_config config;
  split_data splits[SPLIT_COUNT];
} blobs;

static void free_splits(blobs* self) {
  int i;
  for (i = 0; i < SPLIT_COUNT; ++i) {
    free(self->splits[i].inputs);
    free(self->splits[i].labels);
    self->splits[i].size = 0;
    self->splits[i].inputs = NULL;
    self->splits[i].labels = NULL;
  }
}

/* Index into self->splits, or -1 for a split this module does not know. */
static int split_index(kiln_split split) {
  switch (split) {
    case KILN_SPLIT_TRAIN: return SPLIT_TRAIN;
    case KILN_SPLIT_VAL: return SPLIT_VAL;
    case KILN_SPLIT_TEST: return SPLIT_TEST;
    case KILN_SPLIT_PREDICT: return SPLIT_TEST;
    default: return -1;
  }
}

/* Returns 0 when out of memory. malloc(0) may return NULL, hence the +1s. */
static int generate_split(const blobs_config* config, const float* centroids, int64_t size,
                          uint64_t stream, split_data* out) {
  const size_t features = (size_t)config->features;
  rng r = rng_stream(config->seed, stream);
  int64_t i;
  size_t j;

  out->size = size;
  out->inputs = malloc((size_t)size * features * sizeof(float) + 1);
  out->labels = malloc((size_t)size * sizeof(int64_t) + 1);
  if (out->inputs == NULL || out->labels == NULL) return 0;
  for (i = 0; i < size; ++i) {
    const int64_t label = i % config->classes;
    const float* centroid = centroids + (size_t)label * features;
    float* row = out->inputs + (size_t)i * features;
    out->labels[i] = label;
    for (j = 0; j < features; ++j) row[j] = centroid[j] + (float)rng_normal(&r);
  }
  return 1;
}

static kiln_error* blobs_create(const kiln_host* host, const char* config_toml,
                                kiln_instance** out) {
  blobs_config config = default_config;
  kiln_error* error = parse_config(host, config_toml, &config);
  blobs* self;
  if (error != NULL) return error;
  self = calloc(1, sizeof *self);
  if (self == NULL) return fail(host, "out of memory");
  self->host = host;
  self->config = config;
  *out = (kiln_instance*)self;
  return NULL;
}

static kiln_error* blobs_setup(kiln_instance* instance, kiln_stage stage) {
  blobs* self = (blobs*)instance;
  const blobs_config* config = &self->config;
  const size_t centroid_count = (size_t)(config->classes * config->features);
  float* centroids = malloc(centroid_count * sizeof(float));
  rng r = rng_stream(config->seed, 0);
  size_t i;
  int ok;
  (void)stage; /* every stage gets every split: length() is then always right */

  free_splits(self);
  if (centroids == NULL) return fail(self->host, "out of memory for %zu centroids", centroid_count);
  for (i = 0; i < centroid_count; ++i) centroids[i] = (float)rng_normal(&r);
  ok = generate_split(config, centroids, config->train_size, 1, &self->splits[SPLIT_TRAIN]) &&
       generate_split(config, centroids, config->val_size, 2, &self->splits[SPLIT_VAL]) &&
       generate_split(config, centroids, config->test_size, 3, &self->splits[SPLIT_TEST]);
  free(centroids);
  if (!ok) {
    free_splits(self);
    return fail(self->host,
                "out of memory generating the data; lower train_size, val_size, "
                "test_size or features");
  }
  return NULL;
}

static kiln_error* blobs_teardown(kiln_instance* instance, kiln_stage stage, int32_t failed) {
  (void)stage;
  (void)failed;
  free_splits((blobs*)instance);
  return NULL;
}

static void blobs_destroy(kiln_instance* instance) {
  free_splits((blobs*)instance);
  free(instance);
}

static kiln_error* blobs_length(kiln_instance* instance, kiln_split split, int64_t* out) {
  blobs* self = (blobs*)instance;
  const int index = split_index(split);
  if (index < 0) return fail(self->host, "unknown split %d", (int)split);
  *out = self->splits[index].size;
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Batches as DLPack                                                         */
/* ------------------------------------------------------------------------ */

/* A DLPack tensor and its shape in one allocation; the data in another. */
typedef struct owned_array {
  DLManagedTensor managed;
  int64_t shape[2];
} owned_array;

/* Runs when the host drops its last reference, possibly on another thread. */
static void owned_array_delete(DLManagedTensor* managed) {
  owned_array* array = (owned_array*)managed->manager_ctx;
  free(managed->dl_tensor.data);
  free(array);
}

/* A compact CPU array of shape [rows] (ndim 1) or [rows, cols] (ndim 2), or
 * NULL when out of memory. */
static DLManagedTensor* owned_array_new(DLDataTypeCode code, uint8_t bits, int ndim, int64_t rows,
                                        int64_t cols) {
  const size_t elements = (size_t)rows * (ndim == 2 ? (size_t)cols : 1u);
  owned_array* array = calloc(1, sizeof *array);
  void* data = malloc(elements * (bits / 8u) + 1);
  DLTensor* tensor;
  if (array == NULL || data == NULL) {
    free(array);
    free(data);
    return NULL;
  }
  array->shape[0] = rows;
  array->shape[1] = cols;
  tensor = &array->managed.dl_tensor;
  tensor->data = data;
  tensor->device.device_type = kDLCPU;
  tensor->device.device_id = 0;
  tensor->ndim = ndim;
  tensor->dtype.code = (uint8_t)code;
  tensor->dtype.bits = bits;
  tensor->dtype.lanes = 1;
  tensor->shape = array->shape;
  tensor->strides = NULL; /* compact, row-major */
  tensor->byte_offset = 0;
  array->managed.manager_ctx = array;
  array->managed.deleter = owned_array_delete;
  return &array->managed;
}

/* Read-only on data fixed in setup, so it is safe on several threads at once
 * (KILN_DATA_CONCURRENT_GET_BATCH). */
static kiln_error* blobs_get_batch(kiln_instance* instance, kiln_split split,
                                   const int64_t* indices, size_t count, kiln_batch** out) {
  blobs* self = (blobs*)instance;
  const kiln_host* host = self->host;
  const size_t features = (size_t)self->config.features;
  const int index = split_index(split);
  const split_data* data;
  DLManagedTensor* input;
  DLManagedTensor* target;
  kiln_tensor* input_handle;
  kiln_tensor* target_handle;
  kiln_batch* batch;
  kiln_error* error = NULL;
  size_t i;

  if (index < 0) return fail(host, "unknown split %d", (int)split);
  data = &self->splits[index];
  for (i = 0; i < count; ++i) {
    if (indices[i] < 0 || indices[i] >= data->size)
      return fail(host, "sample index %lld is out of range for a split of %lld",
                  (long long)indices[i], (long long)data->size);
  }

  input = owned_array_new(kDLFloat, 32, 2, (int64_t)count, (int64_t)features);
  target = owned_array_new(kDLInt, 64, 1, (int64_t)count, 0);
  if (input == NULL || target == NULL) {
    if (input != NULL) input->deleter(input);
    if (target != NULL) target->deleter(target);
    return fail(host, "out of memory for a batch of %zu samples", count);
  }
  for (i = 0; i < count; ++i) {
    memcpy((float*)input->dl_tensor.data + i * features,
           data->inputs + (size_t)indices[i] * features, features * sizeof(float));
    ((int64_t*)target->dl_tensor.data)[i] = data->labels[indices[i]];
  }

  /* From here on the host owns each array: tensor_from_dlpack takes it over,
   * and batch_put takes over the handle even when it fails. */
  input_handle = host->tensor_from_dlpack(host, input, &error);
  if (input_handle == NULL) {
    target->deleter(target);
    return error;
  }
  target_handle = host->tensor_from_dlpack(host, target, &error);
  if (target_handle == NULL) {
    host->tensor_release(host, input_handle);
    return error;
  }
  batch = host->batch_new(host);
  if (batch == NULL) {
    host->tensor_release(host, input_handle);
    host->tensor_release(host, target_handle);
    return fail(host, "the host could not create a batch");
  }
  error = host->batch_put(host, batch, "input", input_handle);
  if (error != NULL) {
    host->tensor_release(host, target_handle);
    host->batch_release(host, batch);
    return error;
  }
  error = host->batch_put(host, batch, "target", target_handle);
  if (error != NULL) {
    host->batch_release(host, batch);
    return error;
  }
  *out = batch;
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* The entry point                                                           */
/* ------------------------------------------------------------------------ */

static const kiln_lifecycle lifecycle = {
    sizeof(kiln_lifecycle),
    blobs_create,
    blobs_setup,
    blobs_teardown,
    NULL, /* on_exception: teardown frees everything */
    NULL, /* state_save: the data are a function of the config */
    NULL, /* state_load */
    blobs_destroy,
};

static const kiln_data_hooks data_hooks = {
    sizeof(kiln_data_hooks),
    NULL, /* prepare_data: nothing to download */
    blobs_length,
    blobs_get_batch,
#if KILN_ABI_VERSION_MINOR >= 4 /* built against 1.0's header too (tests/abi/v1_0) */
    NULL, /* get_batch_seeded (1.4): nothing random here */
#endif
};

static const kiln_descriptor descriptor = {
    sizeof(kiln_descriptor),
    PLUGIN_ID,
    "Gaussian blobs (C example)",
    "0.1.0",
    "Gaussian blobs from a data module written in plain C",
    KILN_KIND_DATA_MODULE,
    NULL, /* torch_version: links no LibTorch */
    KILN_DATA_CONCURRENT_GET_BATCH,
    &lifecycle,
    &data_hooks,
};

static const kiln_descriptor* const descriptors[] = {&descriptor};

static const kiln_entry entry = {
    sizeof(kiln_entry),
    KILN_ABI_VERSION_MAJOR,
    KILN_ABI_VERSION_MINOR,
    sizeof descriptors / sizeof descriptors[0],
    descriptors,
};

KILN_EXPORT const kiln_entry* kiln_plugin_entry(void);

KILN_EXPORT const kiln_entry* kiln_plugin_entry(void) { return &entry; }
