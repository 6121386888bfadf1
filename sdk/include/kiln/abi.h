/*
 * kiln/abi.h — the kiln plugin ABI, version 1.5.
 *
 * This header is the only contract between the kiln host and its plugins.
 * It is plain C (C99 and C++17), includes only <stddef.h> and <stdint.h>, and
 * never lets a C++ exception cross it.
 *
 * A plugin is a shared object that exports one symbol, `kiln_plugin_entry`
 * (see KILN_ENTRY_SYMBOL), returning a table of descriptors. Each descriptor
 * names one plugin of one kind — model, data module or callback — and carries
 * the function tables the host calls.
 *
 * Versioning
 * ----------
 * - KILN_ABI_VERSION_MAJOR changes only when an existing field changes meaning
 *   or position; the host refuses a plugin whose major differs from its own.
 * - KILN_ABI_VERSION_MINOR grows when fields are appended. A host reads a field
 *   only when the struct's `struct_size` says the plugin's struct contains it
 *   (KILN_HAS_FIELD). A plugin reads host fields the same way.
 * - Every struct that crosses the ABI begins with `size_t struct_size`, set to
 *   `sizeof(the struct)` by whoever fills it. Structs only ever grow at the end.
 * - The smallest size a reader accepts is the struct's size in ABI 1.0,
 *   frozen below as KILN_<STRUCT>_STRUCT_SIZE_1_0 (the size up to its last
 *   1.0 field, as PJRT's *_STRUCT_SIZE macros do), never the current
 *   sizeof: a plugin built against 1.0 keeps loading in every 1.x host.
 * - 1.1 appended kiln_host.error_new_code (error codes, below) and
 *   kiln_host.log_metric_tensor (a metric recorded without a device sync).
 * - 1.2 appended kiln_host.collect (per-sample rows for whole-split
 *   metrics), kiln_model_hooks.on_epoch_end and
 *   kiln_callback_hooks.on_epoch_collected (the rows of every rank, at the
 *   end of an epoch).
 * - 1.3 appended kiln_host.run_file_write (a plugin's own file in the run
 *   directory: a held-out split's rows, a class list).
 * - 1.4 appended kiln_data_hooks.get_batch_seeded (a batch asked for with
 *   the epoch and one seed per sample, for random transforms that are the
 *   same with any number of data workers or processes, and after a resume).
 * - 1.5 appended kiln_model_hooks.check_batch (the model sees a sample of
 *   the data module's batches before anything is written, and refuses a
 *   model and data that do not fit together with exit 2) and
 *   kiln_batch_request.for_check (that sample's request says so).
 * - A NULL function pointer means "not implemented": the host does the default
 *   (documented per hook) and the hook is listed as absent by `kiln inspect`.
 *
 * Errors
 * ------
 * Every fallible hook returns `kiln_error*`: NULL on success, otherwise an
 * error object created with `kiln_host.error_new` or, since 1.1,
 * `kiln_host.error_new_code`, which says what kind of failure it is
 * (KILN_ERROR_*; an error without a code is KILN_ERROR_UNKNOWN). The host
 * exits 2 ("bad input, nothing ran") for KILN_ERROR_INVALID_ARGUMENT from
 * create or setup, and 1 for everything else. Errors are allocated and
 * freed by the host; ownership of a returned error passes to the host. A plugin
 * never frees an error it returned. Plugins written in C++ must catch every
 * exception before it reaches a C frame (the SDK in kiln/plugin.hpp does).
 *
 * Threads and states
 * ------------------
 * Every function below carries one tag, in CLAP's style, saying on which
 * thread it runs (plugin hooks) or may be called (host services), and in
 * which state of the plugin instance:
 *   [main-thread]      the run's main thread; never two calls at once
 *   [prefetch-thread]  a host prefetch thread, or the main thread between
 *                      steps when the host gathers inline (get_batch only)
 *   [any-thread]       any thread, concurrently with others
 *   & created          after create returned, until destroy
 *   & active           after setup was entered, until teardown returns
 *   & failing          after the run failed: on_exception, teardown(failed=1)
 *   & in-state-hook    inside this plugin's state_save / state_load
 * The host checks the thread rule of its services in debug builds.
 *
 * Tensors
 * -------
 * `kiln_tensor*` is an opaque, reference-counted handle. A plugin linked
 * against the host's LibTorch may convert a handle to `at::Tensor` directly
 * (kiln/tensor.hpp) — autograd history is kept, so a loss computed in a plugin
 * back-propagates through the plugin's graph when the host calls backward().
 * A plugin that links no LibTorch hands data over as DLPack
 * (`kiln_host.tensor_from_dlpack`); DLPack cannot carry autograd history, so
 * parameters and losses always cross as handles.
 *
 * Ownership words used below:
 *   "owned"    the receiver must release it (kiln_host.tensor_release, ...);
 *   "borrowed" valid only until the call returns (or as stated); do not release.
 */
#ifndef KILN_ABI_H
#define KILN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ABI_VERSION_MAJOR 1
#define KILN_ABI_VERSION_MINOR 5

/* The symbol every plugin shared object exports. */
#define KILN_ENTRY_SYMBOL "kiln_plugin_entry"

#if defined(_WIN32)
#define KILN_EXPORT __declspec(dllexport)
#else
#define KILN_EXPORT __attribute__((visibility("default")))
#endif

/* True when a struct filled by the other side is large enough to contain
 * `field`: read a field only when this holds. */
#define KILN_HAS_FIELD(ptr, type, field) \
  ((ptr) != NULL && (ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* ------------------------------------------------------------------------ */
/* Opaque types                                                              */
/* ------------------------------------------------------------------------ */

/* An error, created by kiln_host.error_new. Owned by the host once returned. */
typedef struct kiln_error kiln_error;
/* A reference-counted tensor handle (for LibTorch plugins: a c10::TensorImpl*
 * carrying one intrusive reference). */
typedef struct kiln_tensor kiln_tensor;
/* A batch: named tensors on the CPU, created by kiln_host.batch_new. */
typedef struct kiln_batch kiln_batch;
/* A plugin instance; its layout is private to the plugin. */
typedef struct kiln_instance kiln_instance;
/* Streams for plugin state, supplied by the host during state_save/state_load. */
typedef struct kiln_state_writer kiln_state_writer;
typedef struct kiln_state_reader kiln_state_reader;
/* DLPack's managed tensor (dlpack/dlpack.h, v0.6 or later); declared here so
 * that this header needs no other header. */
struct DLManagedTensor;

/* ------------------------------------------------------------------------ */
/* Enumerations (fixed-width integers on the wire; values never change)      */
/* ------------------------------------------------------------------------ */

typedef int32_t kiln_plugin_kind;
#define KILN_KIND_MODEL 1
#define KILN_KIND_DATA_MODULE 2
#define KILN_KIND_CALLBACK 3

/* What the run is doing; passed to setup and teardown. */
typedef int32_t kiln_stage;
#define KILN_STAGE_FIT 1
#define KILN_STAGE_VALIDATE 2
#define KILN_STAGE_TEST 3
#define KILN_STAGE_PREDICT 4

/* Which part of the data a call concerns. */
typedef int32_t kiln_split;
#define KILN_SPLIT_TRAIN 1
#define KILN_SPLIT_VAL 2
#define KILN_SPLIT_TEST 3
#define KILN_SPLIT_PREDICT 4

typedef int32_t kiln_log_level;
#define KILN_LOG_DEBUG 1
#define KILN_LOG_INFO 2
#define KILN_LOG_WARN 3
#define KILN_LOG_ERROR 4

/* Why the run is failing; passed to on_exception. */
typedef int32_t kiln_failure_reason;
#define KILN_FAILURE_PLUGIN_ERROR 1 /* a plugin hook returned an error */
#define KILN_FAILURE_HOST_ERROR 2   /* the host itself failed (I/O, a collective, ...) */
#define KILN_FAILURE_INTERRUPTED 3  /* SIGINT or SIGTERM */
#define KILN_FAILURE_PREEMPTED 4    /* a preemption signal; a checkpoint was committed */
#define KILN_FAILURE_PEER_FAILED 5  /* another rank of the run failed */

/* What kind of failure an error is (kiln_host.error_new_code, ABI 1.1). A
 * closed list: a host treats a code it does not know as KILN_ERROR_UNKNOWN. */
typedef int32_t kiln_error_code;
#define KILN_ERROR_UNKNOWN 0             /* no code given (error_new, ABI 1.0 plugins) */
#define KILN_ERROR_INVALID_ARGUMENT 1    /* the user's input is wrong: a config key, a value, a data file; exit 2 */
#define KILN_ERROR_NOT_FOUND 2           /* something the plugin needs does not exist (a file, a split) */
#define KILN_ERROR_FAILED_PRECONDITION 3 /* called in a state that does not allow it */
#define KILN_ERROR_RESOURCE_EXHAUSTED 4  /* out of memory, disk, handles */
#define KILN_ERROR_UNIMPLEMENTED 5       /* the plugin does not support what was asked */
#define KILN_ERROR_INTERNAL 6            /* a bug, or a failure of a library below the plugin */

/* Flags of kiln_host.log_metric. */
#define KILN_METRIC_REDUCE_MEAN 0u       /* weighted mean over the epoch (default) */
#define KILN_METRIC_REDUCE_SUM 1u        /* sum over the epoch */
#define KILN_METRIC_REDUCE_MAX 2u
#define KILN_METRIC_REDUCE_MIN 3u
#define KILN_METRIC_REDUCE_MASK 0xFu
#define KILN_METRIC_PROGRESS_BAR (1u << 4) /* also show it on the progress line */
#define KILN_METRIC_RANK_ZERO_ONLY (1u << 5) /* recorded on rank 0 only; never synced */

/* Flags of kiln_descriptor.flags. */
/* get_batch may run on several host threads at once. Without this flag the
 * host calls get_batch from one thread at a time. */
#define KILN_DATA_CONCURRENT_GET_BATCH (1ull << 0)

/* Flags of the parameter visitor. */
#define KILN_TENSOR_PARAMETER 1u /* trainable or not: given to the optimizer if it requires grad */
#define KILN_TENSOR_BUFFER 2u    /* state that is not a parameter (e.g. running statistics) */

/* ------------------------------------------------------------------------ */
/* Host services                                                             */
/* ------------------------------------------------------------------------ */

/* Information about the failure that ends a run; borrowed by on_exception. */
typedef struct kiln_exception_info {
  size_t struct_size;
  kiln_failure_reason reason;
  const char* message;   /* the first error's message, never NULL */
  const char* plugin_id; /* the plugin that failed first, or NULL if not a plugin */
  const char* hook;      /* the hook that failed first ("setup", ...), or NULL */
  int32_t rank;          /* the rank where the first error happened */
} kiln_exception_info;

/* Where the run is; borrowed by callback hooks. */
typedef struct kiln_progress {
  size_t struct_size;
  kiln_stage stage;
  int64_t epoch;       /* 0-based */
  int64_t global_step; /* optimizer steps taken so far */
  int64_t batch_index; /* index of the batch within the epoch, or -1 */
  int64_t max_epochs;  /* -1 when unbounded */
  int64_t max_steps;   /* -1 when unbounded */
} kiln_progress;

/* The table of services the host gives every plugin at create time. It stays
 * valid, unchanged, until that plugin's destroy returns. Unless stated,
 * functions may be called from any thread the host calls the plugin on. */
typedef struct kiln_host {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* kiln_version; /* e.g. "0.1.0" */
  void* host_data;          /* private to the host: pass `host` back unchanged */

  /* --- errors ----------------------------------------------------------- */
  /* [any-thread & created] Creates an error to return from a hook.
   * `message` is copied; one line, saying what went wrong and, where
   * possible, what to do. */
  kiln_error* (*error_new)(const struct kiln_host* host, const char* message);

  /* --- logging ---------------------------------------------------------- */
  /* [any-thread & created] Writes one line to the run's log, prefixed with
   * the plugin id. */
  void (*log)(const struct kiln_host* host, kiln_log_level level, const char* message);

  /* --- metrics ---------------------------------------------------------- */
  /* [any-thread & active] Records one value of a metric. The host reduces
   * all values of an epoch (KILN_METRIC_REDUCE_*), across ranks too, at
   * fixed points where every rank takes part; a plugin never syncs. `weight`
   * weighs the value in a mean (use the number of samples it covers; 1 if
   * unsure). Calls are serialised by the host; a value recorded on a
   * prefetch thread counts in the reduction that follows its arrival. */
  void (*log_metric)(const struct kiln_host* host, const char* name, double value, double weight,
                     uint32_t flags);
  /* [main-thread & active] Reads the latest reduced value of a metric
   * (e.g. "val/loss" after a validation epoch). Returns 1 and writes *out if
   * the metric exists, else 0. */
  int (*metric_get)(const struct kiln_host* host, const char* name, double* out);

  /* --- run -------------------------------------------------------------- */
  /* [any-thread & created] This process's rank and the number of ranks. A
   * data module always gets
   * 0 and 1: the host shards every split, and a data module that sharded
   * itself again would train on a fraction of its data (Lightning's double
   * sharding). It describes the whole dataset, identically on every rank; the
   * start-up agreement checks that the split lengths match. */
  int32_t (*rank)(const struct kiln_host* host);
  int32_t (*world_size)(const struct kiln_host* host);
  /* [main-thread & active] Asks the run to stop after the current step. All
   * ranks agree on the stop before acting on it. `reason` is copied and
   * logged. */
  void (*request_stop)(const struct kiln_host* host, const char* reason);

  /* --- tensors ---------------------------------------------------------- */
  /* [any-thread & created] Wraps a DLPack tensor without copying. Takes
   * ownership of `managed`, even
   * on failure: its deleter runs when the last reference to the returned
   * handle is released (possibly on another thread), or before this returns
   * NULL with *error set (e.g. an unsupported dtype, device memory, or a
   * first element at data + byte_offset not aligned to its size). Never call
   * the deleter yourself after passing it here. */
  kiln_tensor* (*tensor_from_dlpack)(const struct kiln_host* host, struct DLManagedTensor* managed,
                                     kiln_error** error);
  /* [any-thread & created] Exports a tensor as DLPack (zero-copy; the
   * tensor must not require grad). The caller owns the result and must call
   * its deleter. NULL with *error set on failure. */
  struct DLManagedTensor* (*tensor_to_dlpack)(const struct kiln_host* host,
                                               const kiln_tensor* tensor, kiln_error** error);
  /* [any-thread & created] Adds a reference; returns `tensor`. */
  kiln_tensor* (*tensor_retain)(const struct kiln_host* host, kiln_tensor* tensor);
  /* [any-thread & created] Drops a reference. NULL is ignored. */
  void (*tensor_release)(const struct kiln_host* host, kiln_tensor* tensor);

  /* --- batches ---------------------------------------------------------- */
  /* [any-thread & created] Creates an empty batch, owned by the caller
   * until returned from get_batch (or released with batch_release). NULL only
   * when memory is exhausted. */
  kiln_batch* (*batch_new)(const struct kiln_host* host);
  /* [any-thread & created] Stores `tensor` under `name` (copied), taking
   * ownership of the handle even on failure. A name may appear once. */
  kiln_error* (*batch_put)(const struct kiln_host* host, kiln_batch* batch, const char* name,
                           kiln_tensor* tensor);
  /* [any-thread & created] Returns the tensor under `name`, borrowed for as
   * long as the batch lives, or NULL if there is none. */
  kiln_tensor* (*batch_get)(const struct kiln_host* host, const kiln_batch* batch,
                            const char* name);
  /* [any-thread & created] Number of tensors, and the name at position
   * `index` (borrowed). */
  size_t (*batch_count)(const struct kiln_host* host, const kiln_batch* batch);
  const char* (*batch_name_at)(const struct kiln_host* host, const kiln_batch* batch,
                               size_t index);
  /* [any-thread & created] Frees a batch the caller owns (and the
   * references it holds). */
  void (*batch_release)(const struct kiln_host* host, kiln_batch* batch);

  /* --- plugin state ----------------------------------------------------- */
  /* [main-thread & in-state-hook] Stores a named blob of bytes (copied)
   * during state_save. */
  kiln_error* (*state_write)(const struct kiln_host* host, kiln_state_writer* writer,
                             const char* key, const void* data, size_t size);
  /* [main-thread & in-state-hook] Finds a blob saved under `key` during
   * state_load. Returns 1 and sets
   * *data / *size (borrowed until state_load returns) if found, else 0. */
  int (*state_read)(const struct kiln_host* host, kiln_state_reader* reader, const char* key,
                    const void** data, size_t* size);

  /* --- ABI 1.1 ---------------------------------------------------------- */
  /* [any-thread & created] As error_new, with a KILN_ERROR_* code saying
   * what kind of failure it is. Check KILN_HAS_FIELD(host, kiln_host,
   * error_new_code) first: a 1.0 host lacks it (fall back to error_new). */
  kiln_error* (*error_new_code)(const struct kiln_host* host, kiln_error_code code,
                                const char* message);
  /* [main-thread & active] Records a metric whose value is a one-element
   * real tensor (a 0-d loss or accuracy, on any device; integer or floating)
   * without reading it back: the host accumulates it where it lives and
   * reads it only at log points (metric reductions at epoch and validation
   * ends, checkpoints), so the step never waits for the device. `value` is
   * borrowed, and its value is taken at the call, as log_metric's is: the
   * host copies it on its device (detached), so the plugin may change or
   * reuse the tensor afterwards. A complex tensor, or one of several
   * elements, is refused and logged. Reductions, weights and ranks as for
   * log_metric; a metric keeps one reduction in an epoch, whichever path
   * records it. Main
   * thread only (model steps, callbacks): a data module on a prefetch thread
   * uses log_metric. Check KILN_HAS_FIELD(host, kiln_host, log_metric_tensor)
   * first: a 1.0 host lacks it (read the value and call log_metric; the C++
   * SDK's Host::log_metric(name, tensor) does). */
  void (*log_metric_tensor)(const struct kiln_host* host, const char* name, const kiln_tensor* value,
                            double weight, uint32_t flags);

  /* --- ABI 1.2 ---------------------------------------------------------- */
  /* [main-thread & active] Inside training_step, validation_step or
   * test_step only: hands the host `rows`, one row per sample of the step's
   * batch (its first dimension is the batch's number of samples; any dtype
   * but complex, any trailing shape), under `name`, for a metric over the
   * whole split (AUROC, F1, a confusion matrix: docs/metrics.md). The host
   * copies the rows at the call (detached; from a device without waiting
   * for it) and tags each with its sample index. At the end of the epoch it
   * gathers every rank's rows and passes the whole split, ordered by sample
   * index, each sample once, to kiln_model_hooks.on_epoch_end and
   * kiln_callback_hooks.on_epoch_collected, identically on every rank.
   * `rows` is borrowed. Every step of an epoch collects the same names, each
   * once, with the same dtype and trailing shape on every step and rank.
   * Returns NULL, or an error saying what is wrong (a first dimension that
   * is not the batch's, a dtype or shape that changed, a call outside a
   * step, or from another thread); the host also fails the step with it,
   * so a plugin may return it or not. Names beginning with "kiln." are the
   * host's. Check KILN_HAS_FIELD(host, kiln_host, collect) first: a 1.0 or
   * 1.1 host lacks it. */
  kiln_error* (*collect)(const struct kiln_host* host, const char* name, const kiln_tensor* rows);

  /* --- ABI 1.3 ---------------------------------------------------------- */

  /* [main-thread & created] (1.3) Saves `size` bytes of `data` (copied) as
   * the file `name` in this plugin's folder of the run directory,
   * <run.dir>/<plugin id>/<name>: what a person or a later command needs to
   * know how the plugin read its input (the rows a seeded split held out, a
   * class list). Only rank 0's file is written; the other ranks' calls are
   * accepted. Nothing is written before the start-up agreement: a file saved
   * earlier (in create or setup) is written then, and one saved later at
   * once; each replaces the file atomically. `kiln inspect`, which writes
   * no run directory, accepts it, shows it and writes nothing. `name`: 1 to 128 letters,
   * digits, '.', '_' or '-', not beginning with '.'. Check
   * KILN_HAS_FIELD(host, kiln_host, run_file_write) first: a 1.0 to 1.2
   * host lacks it. */
  kiln_error* (*run_file_write)(const struct kiln_host* host, const char* name, const void* data, size_t size);
} kiln_host;

/* ------------------------------------------------------------------------ */
/* Plugin function tables                                                    */
/* ------------------------------------------------------------------------ */

/* The lifecycle every kind shares. Order for one run (see docs/hooks.md):
 *   create -> setup(stage) -> ...kind hooks... -> teardown(stage, failed=0) -> destroy
 * On any failure after create:
 *   on_exception(info), exactly once, on every created plugin;
 *   teardown(stage, failed=1), exactly once, on every plugin whose setup was
 *   entered (including one whose setup failed);
 *   destroy on every created plugin.
 * A failure in on_exception or teardown is logged and does not stop the
 * host from calling the others. */
typedef struct kiln_lifecycle {
  size_t struct_size;

  /* [main-thread] Creates an instance. `config_toml` is the TOML text of the plugin's own
   * manifest table (borrowed). `host` stays valid until destroy returns. On
   * success writes *out and returns NULL. On failure returns an error and
   * must not write *out; destroy is not called. Required. */
  kiln_error* (*create)(const kiln_host* host, const char* config_toml, kiln_instance** out);

  /* [main-thread & created] Acquires what the stage needs (load data, build
   * layers, open files). NULL: nothing to do. */
  kiln_error* (*setup)(kiln_instance* self, kiln_stage stage);

  /* [main-thread & active] (and failing when `failed` is 1) Releases what
   * setup acquired. `failed` is 1 when the run is failing: a
   * `finally`, called even when this plugin's own setup failed part-way.
   * NULL: nothing to do. */
  kiln_error* (*teardown)(kiln_instance* self, kiln_stage stage, int32_t failed);

  /* [main-thread & failing] Told once that the run is failing, before any
   * teardown. `info` is
   * borrowed. The returned error, if any, is logged and otherwise ignored.
   * NULL: nothing to do. */
  kiln_error* (*on_exception)(kiln_instance* self, const kiln_exception_info* info);

  /* [main-thread & active] Saves the plugin's own state into a checkpoint
   * (kiln_host.state_write). NULL: the plugin has no state. */
  kiln_error* (*state_save)(kiln_instance* self, kiln_state_writer* writer);

  /* [main-thread & active] Restores state saved by state_save, after setup.
   * NULL: no state. */
  kiln_error* (*state_load)(kiln_instance* self, kiln_state_reader* reader);

  /* [main-thread & created] Frees the instance. Called exactly once for
   * every successful create, last. Must not fail. Required. */
  void (*destroy)(kiln_instance* self);
} kiln_lifecycle;

/* Called once per tensor by kiln_model_hooks.parameters. `name` is a dotted
 * path ("fc1.weight"), borrowed; `tensor` is borrowed for the call (retain it
 * to keep it). `flags` is KILN_TENSOR_PARAMETER or KILN_TENSOR_BUFFER. */
typedef void (*kiln_tensor_visitor)(void* context, const char* name, kiln_tensor* tensor,
                                    uint32_t flags);

typedef struct kiln_model_hooks {
  size_t struct_size;

  /* [main-thread & active] Visits every parameter and buffer, in a fixed
   * order, after setup. The
   * host moves them to the run's device in place and builds the optimizer
   * from the parameters that require grad. Required. */
  kiln_error* (*parameters)(kiln_instance* self, void* context, kiln_tensor_visitor visit);

  /* [main-thread & active] Computes the training loss of one batch
   * (borrowed, already on the run's
   * device). Writes an owned scalar handle to *loss; the host back-propagates
   * through it. The model is in training mode. Required for fit. */
  kiln_error* (*training_step)(kiln_instance* self, const kiln_batch* batch, int64_t batch_index,
                               kiln_tensor** loss);

  /* [main-thread & active] Evaluates one batch; records metrics with
   * kiln_host.log_metric. Runs
   * without autograd, in evaluation mode. NULL: validation is skipped. */
  kiln_error* (*validation_step)(kiln_instance* self, const kiln_batch* batch,
                                 int64_t batch_index);

  /* [main-thread & active] As validation_step, for the test split. NULL:
   * `kiln test` is refused. */
  kiln_error* (*test_step)(kiln_instance* self, const kiln_batch* batch, int64_t batch_index);

  /* [main-thread & active] Predicts one batch; writes an owned handle to
   * *output (one row per
   * sample). NULL: `kiln predict` is refused. */
  kiln_error* (*predict_step)(kiln_instance* self, const kiln_batch* batch, int64_t batch_index,
                              kiln_tensor** output);

  /* --- ABI 1.2 ---------------------------------------------------------- */
  /* [main-thread & active] The end of an epoch of `split` (KILN_SPLIT_TRAIN,
   * _VAL or _TEST), on every rank, after its last step and before its
   * metrics are reduced (so what it logs is in the epoch's row, and
   * callbacks and checkpoint.monitor see it). `collected` (borrowed until
   * the hook returns) holds what the steps collected (kiln_host.collect)
   * on every rank: the whole split — or the batches that ran, with
   * limit_*_batches or a stopped epoch — ordered by sample index, each
   * sample once, plus "kiln.index" (int64 [N], the sample indices). It is
   * empty when nothing was collected. Every rank gets the same bytes, so a
   * value computed from them is the same everywhere: a metric logged here
   * (log_metric, log_metric_tensor) is taken as it is, not averaged over
   * ranks (its reduction flag is ignored; logged twice, the last value
   * counts). A training epoch resumed from a mid-epoch checkpoint gets the
   * rows collected before the checkpoint too. Runs under no-grad, in
   * evaluation mode for val and test. NULL: nothing is called (the rows are
   * still gathered when a callback wants them). */
  kiln_error* (*on_epoch_end)(kiln_instance* self, kiln_split split, const kiln_batch* collected);

  /* --- ABI 1.5 ---------------------------------------------------------- */
  /* [main-thread & active] Looks at a sample of `split`'s batches — its
   * first samples (at most 2), as the data module's get_batch built them,
   * on the CPU — after setup and before anything runs or is written, once
   * for each split the command reads. Return KILN_ERROR_INVALID_ARGUMENT
   * for a batch this model cannot take (a shape or dtype it was not built
   * for, a key it needs), naming what it expected and what it got: the
   * host then exits 2 and writes nothing. Must not change the model's
   * state. NULL: nothing is checked before the first step. */
  kiln_error* (*check_batch)(kiln_instance* self, kiln_split split, const kiln_batch* batch);
} kiln_model_hooks;

/* The batch kiln_data_hooks.get_batch_seeded is asked for (1.4). Borrowed
 * for the call. */
typedef struct kiln_batch_request {
  size_t struct_size;
  kiln_split split;
  const int64_t* indices; /* `count` sample indices of `split` */
  size_t count;
  /* `count` seeds: sample_seeds[i] is a pure function of (run.seed, split,
   * epoch, indices[i]) (docs/data.md gives it), so a sample's random
   * transforms seeded from it are the same on every rank, with any number
   * of data workers, and after a resume, and differ between epochs. */
  const uint64_t* sample_seeds;
  int64_t epoch; /* 0-based training epoch; 0 for val, test and predict (every validation sees the same transforms) */
  /* 1.5: 1 when the batch is the sample kiln_model_hooks.check_batch looks
   * at before anything runs (no step trains or evaluates it); 0 for a
   * step's. Served as those samples would be, it must leave no trace: not
   * counted, logged, cached or advancing any state (docs/abi.md). */
  int32_t for_check;
} kiln_batch_request;

typedef struct kiln_data_hooks {
  size_t struct_size;

  /* [main-thread & created] Downloads or unpacks data once per node (local
   * rank 0), before setup on
   * any rank; other ranks wait at a barrier. NULL: nothing to do. */
  kiln_error* (*prepare_data)(kiln_instance* self);

  /* [main-thread & active] Number of samples in `split`, after setup. 0
   * means the split is absent.
   * Required. */
  kiln_error* (*length)(kiln_instance* self, kiln_split split, int64_t* out);

  /* [prefetch-thread & active] Builds the batch of samples
   * `indices[0..count)` (borrowed) of `split` into
   * a batch created with kiln_host.batch_new, returned through *out (ownership
   * passes to the host). Tensors are on the CPU; conventionally "input" and
   * "target". The data module never sees a device, a rank or a generator: the
   * host samples, shards, orders and places.
   * Threads: on a host prefetch thread, where it may overlap with the
   * model's hooks on the main thread, or on the main thread itself, between
   * steps, when the host gathers inline (trainer.prefetch = "inline", or
   * "auto" when it chooses inline); a data module must work on either, and
   * may not call [main-thread] services. One call at a time unless the
   * descriptor sets KILN_DATA_CONCURRENT_GET_BATCH. Required. */
  kiln_error* (*get_batch)(kiln_instance* self, kiln_split split, const int64_t* indices,
                           size_t count, kiln_batch** out);

  /* 1.4 [prefetch-thread & active] get_batch, with what the host decided
   * about the batch (kiln_batch_request): its epoch and a seed per sample.
   * When set, a 1.4 host calls it instead of get_batch, on the same threads
   * and under the same KILN_DATA_CONCURRENT_GET_BATCH rule; an older host
   * calls get_batch, which a data module still provides. NULL: get_batch. */
  kiln_error* (*get_batch_seeded)(kiln_instance* self, const kiln_batch_request* request, kiln_batch** out);
} kiln_data_hooks;


/* [main-thread & active] Every callback hook. Each may be NULL. `progress`
 * is borrowed. A callback reads
 * metrics with kiln_host.metric_get and may ask to stop with
 * kiln_host.request_stop. */
typedef kiln_error* (*kiln_callback_hook)(kiln_instance* self, const kiln_progress* progress);

typedef struct kiln_callback_hooks {
  size_t struct_size;
  kiln_callback_hook on_fit_start;
  kiln_callback_hook on_fit_end;
  kiln_callback_hook on_train_epoch_start;
  kiln_callback_hook on_train_epoch_end; /* after the epoch's metrics are reduced */
  kiln_callback_hook on_train_batch_end; /* after the optimizer step, if any */
  kiln_callback_hook on_validation_start;
  kiln_callback_hook on_validation_end; /* after validation metrics are reduced */
  kiln_callback_hook on_test_end;

  /* --- ABI 1.2 ---------------------------------------------------------- */
  /* [main-thread & active] After kiln_model_hooks.on_epoch_end, with the
   * same `collected` rows (borrowed until it returns; see there), on every
   * rank: e.g. a callback that writes a confusion matrix (write it on rank
   * 0 only). Called only when the epoch collected something. NULL: not
   * called. */
  kiln_error* (*on_epoch_collected)(kiln_instance* self, const kiln_progress* progress, kiln_split split,
                                    const kiln_batch* collected);
} kiln_callback_hooks;

/* ------------------------------------------------------------------------ */
/* Descriptors and the entry point                                           */
/* ------------------------------------------------------------------------ */

typedef struct kiln_descriptor {
  size_t struct_size;
  const char* id;          /* unique, reverse-DNS style: "org.example.mlp" */
  const char* name;        /* for people */
  const char* version;     /* the plugin's own version */
  const char* description; /* one line, may be NULL */
  kiln_plugin_kind kind;
  /* "MAJOR.MINOR[.PATCH]" of the LibTorch the plugin was compiled against, or
   * NULL for a plugin that links no LibTorch. The host refuses a plugin built
   * against another LibTorch major.minor than its own. */
  const char* torch_version;
  uint64_t flags; /* KILN_DATA_* for data modules; 0 otherwise */
  const kiln_lifecycle* lifecycle;
  /* Points to the table for `kind`: kiln_model_hooks, kiln_data_hooks or
   * kiln_callback_hooks. Each begins with struct_size. */
  const void* hooks;
} kiln_descriptor;

typedef struct kiln_entry {
  size_t struct_size;
  uint32_t abi_major; /* KILN_ABI_VERSION_MAJOR the plugin was built with */
  uint32_t abi_minor;
  size_t descriptor_count;
  const kiln_descriptor* const* descriptors;
} kiln_entry;

/* ------------------------------------------------------------------------ */
/* Frozen sizes of ABI 1.0: the floor every reader accepts                    */
/* ------------------------------------------------------------------------ */

#define KILN_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))
#define KILN_ENTRY_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_entry, descriptors)
#define KILN_DESCRIPTOR_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_descriptor, hooks)
#define KILN_LIFECYCLE_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_lifecycle, destroy)
#define KILN_MODEL_HOOKS_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_model_hooks, predict_step)
#define KILN_DATA_HOOKS_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_data_hooks, get_batch)
#define KILN_CALLBACK_HOOKS_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_callback_hooks, on_test_end)
#define KILN_HOST_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_host, state_read)
#define KILN_EXCEPTION_INFO_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_exception_info, rank)
#define KILN_PROGRESS_STRUCT_SIZE_1_0 KILN_STRUCT_SIZE(kiln_progress, max_steps)
/* Structs added after 1.0: the floor is their layout as first published. */
#define KILN_BATCH_REQUEST_STRUCT_SIZE_1_4 KILN_STRUCT_SIZE(kiln_batch_request, epoch)

/* [main-thread] The exported entry point. Returns a static table that stays
 * valid while the library is loaded; may be called several times, and must
 * not allocate resources or touch the host. */
typedef const kiln_entry* (*kiln_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_ABI_H */
