/*
 * pyllamaspec C API: speculative-decoding sessions over libllama + libllama-common.
 *
 * The one source of truth for the binding: Python (cffi, ABI mode) reads the declarations between
 * the PLS_CDEF_BEGIN / PLS_CDEF_END markers verbatim, so that region holds plain C only (no macros,
 * no includes). Every type is POD. Fallible calls return NULL or a negative value and write a
 * message into (err, err_size).
 */
#ifndef PYLLAMASPEC_H
#define PYLLAMASPEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* PLS_CDEF_BEGIN */

typedef struct pls_model pls_model;
typedef struct pls_session pls_session;

/* ---- library ---------------------------------------------------------------------------- */

/* Bumped whenever a struct or a function signature below changes; Python refuses a library of another version. */
int32_t pls_abi_version(void);

/* JSON text: backends compiled in, devices visible (name, description, type, free/total bytes). */
int32_t pls_system_info_json(char * buf, int32_t buf_size);

/* 0 = errors only (the default), 1 = warnings, 2 = info, 3 = debug. Logs go to stderr. */
void pls_set_log_level(int32_t level);

/* ---- models ------------------------------------------------------------------------------ */

typedef struct pls_model_params {
    const char * path;
    int32_t      n_gpu_layers;      /* -1: all layers that the devices can take; 0: CPU only */
    const char * devices;           /* comma-separated device names (e.g. "CUDA0,CUDA1"); "none" = CPU; NULL = all */
    int32_t      split_mode;        /* 0 none, 1 layer, 2 row, 3 tensor */
    int32_t      main_gpu;
    const float * tensor_split;     /* n_tensor_split proportions, or NULL */
    int32_t      n_tensor_split;
    const char * tensor_overrides;  /* "regex=BUFT,regex=BUFT" as llama.cpp's -ot */
    int32_t      n_cpu_moe;         /* keep the MoE experts of the first N layers on the CPU */
    int32_t      load_mtp;          /* -1 auto (when the GGUF has NextN layers), 0 no, 1 yes */
    int32_t      use_mmap;
} pls_model_params;

typedef struct pls_model_info {
    char     arch[64];
    char     desc[128];
    int32_t  n_vocab;
    int32_t  n_embd;
    int32_t  n_layer;
    int32_t  n_layer_nextn;
    int32_t  n_ctx_train;
    int32_t  n_head;
    int32_t  n_head_kv;
    int32_t  n_swa;
    int32_t  is_recurrent;
    int32_t  is_hybrid;
    int32_t  supports_rs_rollback;   /* arch keeps recurrent-state snapshots for rollback */
    int32_t  has_encoder;
    int32_t  has_output;             /* has its own output.weight (else borrows the target's) */
    int32_t  token_bos;
    int32_t  token_eos;
    int32_t  token_eot;
    int32_t  token_mask;
    int32_t  add_bos;
    /* drafter facts (DFlash / EAGLE3) */
    int32_t  dflash_block_size;      /* 0 when not a DFlash drafter */
    int32_t  dflash_selector_top_k;  /* > 0: DFlash2 */
    int32_t  n_target_layers;
    int32_t  target_layers[16];
    uint64_t size_bytes;
    uint64_t n_params;
    char     head_device[64];        /* device holding output.weight; "CPU" for host memory */
} pls_model_info;

pls_model * pls_model_load(const pls_model_params * params, char * err, size_t err_size);
void        pls_model_free(pls_model * model);
int32_t     pls_model_get_info(const pls_model * model, pls_model_info * out);
/* Scalar metadata value as text; returns its length or -1 when absent. */
int32_t     pls_model_meta(const pls_model * model, const char * key, char * buf, int32_t buf_size);

/* Tokenize: returns the number of tokens, or -(needed) when n_tokens_max is too small. */
int32_t pls_tokenize(const pls_model * model, const char * text, int32_t text_len,
                     int32_t * tokens, int32_t n_tokens_max, int32_t add_special, int32_t parse_special);
/* Bytes of one token (may be a partial UTF-8 sequence); returns length or -(needed). */
int32_t pls_token_to_piece(const pls_model * model, int32_t token, char * buf, int32_t buf_size, int32_t special);
int32_t pls_token_is_eog(const pls_model * model, int32_t token);
/* Chat templates through upstream's Jinja engine (common/chat), as llama-server renders them. The messages are
 * n_messages role/content pairs; tmpl (a Jinja template) replaces the model's own when not NULL; enable_thinking
 * -1 keeps the engine's default (it passes enable_thinking = true), 0 off, 1 on (llama.cpp's --reasoning).
 * Returns PLS_CHAT_OK with the prompt in buf and its length in *n_out; PLS_CHAT_BUFFER_TOO_SMALL with the size
 * needed (NUL included) in *n_out; PLS_CHAT_NO_TEMPLATE when tmpl is NULL and the model has no template;
 * PLS_CHAT_TEMPLATE_ERROR when the template cannot be parsed or rendered (err says why). */
enum {
    PLS_CHAT_OK = 0,
    PLS_CHAT_BUFFER_TOO_SMALL = 1,
    PLS_CHAT_NO_TEMPLATE = -1,
    PLS_CHAT_TEMPLATE_ERROR = -2
};
int32_t pls_chat_format(const pls_model * model, const char * tmpl, const char * const * roles,
                        const char * const * contents, int32_t n_messages, int32_t add_generation_prompt,
                        int32_t enable_thinking, char * buf, int32_t buf_size, int32_t * n_out,
                        char * err, size_t err_size);

/* ---- sessions ---------------------------------------------------------------------------- */

/* Speculative types: the values of upstream's common_speculative_type. */
enum {
    PLS_SPEC_NONE = 0,
    PLS_SPEC_DRAFT_SIMPLE = 1,
    PLS_SPEC_DRAFT_EAGLE3 = 2,
    PLS_SPEC_DRAFT_MTP = 3,
    PLS_SPEC_DRAFT_DFLASH = 4,
    PLS_SPEC_DRAFT_DSPARK = 5,
    PLS_SPEC_NGRAM_SIMPLE = 6,
    PLS_SPEC_NGRAM_MAP_K = 7,
    PLS_SPEC_NGRAM_MAP_K4V = 8,
    PLS_SPEC_NGRAM_MOD = 9,
    PLS_SPEC_NGRAM_CACHE = 10,
    PLS_SPEC_COUNT = 11
};

enum {
    PLS_MAX_SPEC_TYPES = 8,
    PLS_MAX_DRAFT = 64,
    PLS_MAX_STREAMS = 64
};

typedef struct pls_session_params {
    int32_t  spec_types[8];         /* PLS_SPEC_*; n_spec_types = 0: none (plain decoding) */
    int32_t  n_spec_types;
    int32_t  n_max;                 /* draft tokens per step, before the per-type clamp */
    int32_t  n_min;
    float    p_min;
    int32_t  n_ctx;
    int32_t  n_batch;
    int32_t  n_ubatch;
    int32_t  n_parallel;            /* streams decoded together (sequences); n_ctx is shared among them */
    int32_t  n_threads;
    int32_t  n_threads_batch;
    int32_t  n_threads_draft;
    int32_t  type_k;                /* ggml_type of the KV cache; -1 = F16 */
    int32_t  type_v;
    int32_t  type_k_draft;
    int32_t  type_v_draft;
    int32_t  flash_attn;            /* -1 auto, 0 off, 1 on */
    int32_t  n_rs_seq;              /* recurrent-state snapshots per sequence; -1 = auto from the effective n_max */
    int32_t  draft_backend_sampling;
    /* sampling of the target */
    float    temp;                  /* <= 0: greedy */
    int32_t  top_k;
    float    top_p;
    float    min_p;
    uint32_t seed;
    /* n-gram settings (0 = upstream default) */
    int32_t  ngram_size_n;
    int32_t  ngram_size_m;
    int32_t  ngram_min_hits;
    int32_t  ngram_mod_n_match;
    int32_t  ngram_mod_n_min;
    int32_t  ngram_mod_n_max;
    /* measurement */
    int32_t  collect_margins;       /* per generated token: target top-1 minus top-2 logit */
    int32_t  force_reject;          /* treat every draft token as rejected (zero-acceptance cost) */
} pls_session_params;

typedef struct pls_session_info {
    int32_t spec_types[8];
    int32_t n_spec_types;
    int32_t n_max_requested;
    int32_t n_max_effective;        /* after the DFlash block-size / MTP head clamp */
    int32_t block_size;
    int32_t is_dflash2;
    int32_t n_rs_seq;               /* snapshot ring of the target context (0: none) */
    uint64_t ring_bytes;            /* memory of the ring (all planes, all sequences) */
    int32_t rollback_target;        /* 0 none, 1 kv (partial seq_rm), 2 ring, 3 checkpoint */
    int32_t rollback_draft;
    int32_t n_ctx;
    int32_t n_batch;
    int32_t n_ubatch;
    int32_t n_parallel;
    int32_t n_target_layers;
    int32_t target_layers[16];
    char    target_head_device[64];
    char    draft_device[64];
} pls_session_info;

typedef struct pls_stats {
    int64_t n_prompt;
    int64_t n_generated;
    int64_t n_steps;                /* verify steps that committed tokens */
    int64_t n_drafts;               /* steps whose draft was non-empty */
    int64_t n_drafted;
    int64_t n_accepted;
    int64_t accepted_per_pos[64];   /* steps in which draft position i was accepted */
    int64_t drafted_per_pos[64];    /* steps in which draft position i was proposed */
    int64_t n_rollback_kv;          /* partial KV removal (attention-only memory) */
    int64_t n_rollback_ring;        /* recurrent-state snapshot ring */
    int64_t n_rollback_checkpoint;  /* checkpoint restore + replay */
    int64_t n_replayed;             /* tokens re-decoded after checkpoint restores */
    double  t_prefill_ms;
    double  t_draft_ms;
    double  t_verify_ms;
    double  t_rollback_ms;
    double  t_sample_ms;
    double  t_decode_ms;            /* wall time of the generation loop after prefill */
} pls_stats;

enum {
    PLS_FINISH_NONE = 0,            /* still generating */
    PLS_FINISH_LENGTH = 1,
    PLS_FINISH_EOG = 2,
    PLS_FINISH_STOPPED = 3,         /* callback, pls_request_stop or Ctrl-C */
    PLS_FINISH_CONTEXT = 4,         /* context full */
    PLS_FINISH_ERROR = 5
};

/* Called once per verify step with the 1..n_max+1 tokens it committed (margins may be NULL).
 * Return non-zero to stop. */
typedef int32_t (*pls_emit_cb)(void * user_data, const int32_t * tokens, const float * margins, int32_t n_tokens);

pls_session * pls_session_open(pls_model * target, pls_model * drafter, const pls_session_params * params,
                               char * err, size_t err_size);
void          pls_session_close(pls_session * session);
int32_t       pls_session_get_info(const pls_session * session, pls_session_info * out);

/* Push style: the whole loop in native code. Returns a PLS_FINISH_* value, or -1 on error. */
int32_t pls_generate(pls_session * session, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                     pls_emit_cb callback, void * user_data, char * err, size_t err_size);

/* Pull style: begin, then step until it reports a finish reason. begin returns 0, -2 when the prompt does
 * not fit the context, -3 for an invalid prompt, -1 for other errors (pls_generate returns the same before it
 * starts). step returns the number of tokens written (0 at the end), or -1 on error; *finish receives PLS_FINISH_*.
 * Error messages of session open start with "pairing:" or "placement:" for those kinds of problem. */
int32_t pls_begin(pls_session * session, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                  char * err, size_t err_size);
int32_t pls_step(pls_session * session, int32_t * tokens, float * margins, int32_t capacity, int32_t * finish,
                 char * err, size_t err_size);

/* Several streams at once (up to n_parallel): their drafts are verified in one target batch per step.
 * prompts holds the n_streams prompts back to back, n_prompt their lengths; each stream gets n_ctx/n_parallel
 * positions. begin_streams returns like pls_begin. step_streams runs one verify step for every active stream and
 * writes stream i's committed tokens (and margins, may be NULL) at row i of tokens[n_streams][capacity], their
 * count to n_tokens[i] and its PLS_FINISH_* to finish[i]; a stream may commit nothing in a step (a checkpoint
 * replay). Returns the number of streams still generating (0: all done), or -1 on error. */
int32_t pls_begin_streams(pls_session * session, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams,
                          int32_t n_predict, char * err, size_t err_size);
int32_t pls_step_streams(pls_session * session, int32_t * tokens, float * margins, int32_t capacity,
                         int32_t * n_tokens, int32_t * finish, char * err, size_t err_size);
/* Counters of one stream of the last begin (timings stay in the session's stats: streams share each step).
 * Returns 0, or -1 for a stream that does not exist. */
int32_t pls_get_stream_stats(const pls_session * session, int32_t stream, pls_stats * out);

/* Teacher-forced margins: the target's top-1 minus top-2 logit at every position of continuation, decoded after
 * the prompt in batches of `chunk` tokens (chunk 1 is plain decoding's shape, n_max + 1 a verify batch's). Writes
 * n_cont margins: margins[i] is the margin of the logits that predict continuation[i]. Comparing two chunk sizes
 * measures how far the target's margins move with batch shape alone. Clears the session's generation.
 * Returns 0, -2 if it does not fit the context, -3 for invalid input, -1 on error. */
int32_t pls_score_margins(pls_session * session, const int32_t * prompt, int32_t n_prompt, const int32_t * continuation,
                          int32_t n_cont, int32_t chunk, float * margins, char * err, size_t err_size);

/* Thread-safe: ends the current generation after the step in flight. */
void pls_request_stop(pls_session * session);

void pls_get_stats(const pls_session * session, pls_stats * out);
void pls_reset_stats(pls_session * session);

/* ---- memory ------------------------------------------------------------------------------ */

typedef struct pls_device_memory {
    char     name[64];              /* device name; "Host" for system memory */
    uint64_t free;
    uint64_t total;
    uint64_t model;                 /* weights */
    uint64_t context;               /* KV cache and recurrent state, the snapshot ring included */
    uint64_t compute;               /* compute buffers */
} pls_device_memory;

typedef struct pls_memory_estimate {
    int32_t n_devices;
    pls_device_memory devices[16];
    int32_t drafter_approximate;    /* the drafter's share is its weights alone (it borrows the target's head) */
} pls_memory_estimate;

/* What a session of these models and settings would allocate on each device, measured by upstream's loader
 * without allocating anything. drafter may be NULL. Returns 0, or -1 with a message. */
int32_t pls_estimate_memory(const pls_model_params * target, const pls_model_params * drafter,
                            const pls_session_params * params, pls_memory_estimate * out, char * err, size_t err_size);

/* ---- tools ------------------------------------------------------------------------------- */

/* Requantize a GGUF through upstream's quantizer. ftype: a llama_ftype value. tensor_types:
 * "regex=TYPE,..." overrides (e.g. a drafter's selector codebooks at F16), or NULL. progress (may be NULL) is
 * called on the calling thread as each tensor starts, with the tensors done so far and their total.
 * Returns 0 or -1. */
typedef void (*pls_progress_cb)(void * user_data, int32_t done, int32_t total);
int32_t pls_quantize(const char * path_in, const char * path_out, int32_t ftype, int32_t n_threads,
                     int32_t allow_requantize, const char * tensor_types, pls_progress_cb progress, void * user_data,
                     char * err, size_t err_size);
/* Name of a llama_ftype value (e.g. "Q4_0"); empty when unknown. */
int32_t pls_ftype_name(int32_t ftype, char * buf, int32_t buf_size);

/* Synthetic models for tests and benchmarks: a tiny-to-realistic random model of an upstream arch,
 * built from metadata alone by upstream's loader and saved as GGUF with F32 weights. */
typedef struct pls_synth_params {
    const char * arch;              /* "llama", "qwen2", "qwen3", "qwen35", ... */
    int32_t  n_vocab;
    int32_t  n_embd;
    int32_t  n_layer;
    int32_t  n_head;
    int32_t  n_head_kv;
    int32_t  n_ff;
    int32_t  n_ctx_train;
    int32_t  full_attention_interval; /* hybrid archs: every Nth layer is attention */
    int32_t  ssm_d_inner;
    int32_t  ssm_d_state;
    int32_t  ssm_n_group;
    int32_t  ssm_d_conv;
    int32_t  n_layer_nextn;         /* MTP heads appended after the trunk */
    uint32_t seed;
    float    stddev;
    uint32_t perturb_seed;          /* 0: none; else add N(0, perturb_stddev) noise (a "draft model") */
    float    perturb_stddev;
} pls_synth_params;

int32_t pls_synth_model(const pls_synth_params * params, const char * path_out, char * err, size_t err_size);

/* PLS_CDEF_END */

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* PYLLAMASPEC_H */
