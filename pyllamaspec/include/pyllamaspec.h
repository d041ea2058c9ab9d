/*
 * pyllamaspec C API: speculative-decoding sessions over libllama + libllama-common.
 *
 * The one source of truth for the binding: Python (cffi, ABI mode) reads the declarations between
 * the PLS_CDEF_BEGIN / PLS_CDEF_END markers verbatim, so that region holds plain C only (no macros,
 * no includes). Every type is POD. Fallible calls return a pls_status (PLS_OK or a negative code) and
 * write a message into (err, err_size); the code alone says what kind of problem it is. No call lets a
 * C++ exception escape, and bad files or arguments are refused before upstream could assert on them.
 *
 * Ownership and threads: a session keeps its models alive (pls_model_free only drops the caller's
 * reference). One call at a time may use a session: a second concurrent call returns PLS_ERR_BUSY instead
 * of racing; pls_request_stop, pls_get_stats and pls_session_get_info may be called from any thread at
 * any time. Models are read-only after loading and may be used from several threads at once.
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

/* ---- status codes ------------------------------------------------------------------------ */

typedef enum pls_status {
    PLS_OK = 0,
    PLS_ERR_INTERNAL = -1,          /* unexpected failure inside llama.cpp or the shim */
    PLS_ERR_CONTEXT = -2,           /* the prompt (or prompt and continuation) does not fit the context */
    PLS_ERR_INVALID = -3,           /* an argument or setting is out of range or contradicts another */
    PLS_ERR_PAIRING = -4,           /* the drafter cannot work with this target */
    PLS_ERR_PLACEMENT = -5,         /* the requested device placement cannot work */
    PLS_ERR_LOAD = -6,              /* a model file is missing, not GGUF, truncated, corrupt or unsupported */
    PLS_ERR_BUSY = -7,              /* another call is using this session right now */
    PLS_ERR_DECODE = -8,            /* llama.cpp failed while decoding */
    PLS_ERR_NO_TEMPLATE = -9,       /* the model has no chat template */
    PLS_ERR_TEMPLATE = -10,         /* the chat template cannot be applied */
    PLS_ERR_MEMORY = -11,           /* an allocation failed (host or device memory) */
    PLS_ERR_REMOTE = -12            /* a remote device (an rpc-server) cannot be reached, does not answer, or went away */
} pls_status;

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

/* On PLS_OK, *out holds a model with one reference (the caller's). */
int32_t     pls_model_load(const pls_model_params * params, pls_model ** out, char * err, size_t err_size);
/* Drops the caller's reference: the model is freed once no session holds it either. */
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
 * Returns PLS_OK with the prompt's length in *n_out: the prompt and a NUL are in buf when *n_out < buf_size,
 * else buf is untouched and the call can be repeated with *n_out + 1 bytes. PLS_ERR_NO_TEMPLATE when tmpl is
 * NULL and the model has no template (no ChatML fallback); PLS_ERR_TEMPLATE when the template cannot be parsed or
 * rendered (err says why); PLS_ERR_INVALID for bad arguments; PLS_ERR_MEMORY. */
int32_t pls_chat_format(const pls_model * model, const char * tmpl, const char * const * roles,
                        const char * const * contents, int32_t n_messages, int32_t add_generation_prompt,
                        int32_t enable_thinking, char * buf, int32_t buf_size, int32_t * n_out,
                        char * err, size_t err_size);
/* Chat requests with tools, as llama-server renders and parses them (upstream's common/chat).
 * pls_chat_apply: request_json is {"messages": [OpenAI chat messages, with tool_calls, tool_call_id, name],
 * "tools": [OpenAI function tools] or null, "tool_choice": "auto"|"none"|"required", "parallel_tool_calls": bool,
 * "add_generation_prompt": bool, "enable_thinking": bool (absent: the engine's default)}; tmpl as in
 * pls_chat_format. The result is a JSON object: "prompt", the reply's "format" (and "format_name"), "parser" and
 * "generation_prompt" (what pls_chat_parse needs), the tool-call "grammar", "grammar_lazy", "grammar_triggers"
 * ([{"type": "word"|"token"|"pattern"|"pattern_full", "value", "token"}]), "preserved_tokens", "additional_stops",
 * "supports_thinking" and the template's "caps".
 * pls_chat_parse: syntax_json is {"format", "parser", "generation_prompt", "parse_tool_calls"} from that result;
 * text the reply so far (is_partial 1 while it grows). The result is the reply as an OpenAI assistant message
 * ({"role", "content", "tool_calls": [{"type", "function": {"name", "arguments"}, "id"?}]}).
 * Both return PLS_OK with the result's length in *n_out, the result and a NUL in buf when *n_out < buf_size (else
 * buf is untouched: call again with *n_out + 1 bytes). PLS_ERR_INVALID for a malformed request;
 * PLS_ERR_NO_TEMPLATE / PLS_ERR_TEMPLATE as pls_chat_format (also when a reply does not match its format);
 * PLS_ERR_MEMORY. */
int32_t pls_chat_apply(const pls_model * model, const char * tmpl, const char * request_json, char * buf,
                       int32_t buf_size, int32_t * n_out, char * err, size_t err_size);
int32_t pls_chat_parse(const char * syntax_json, const char * text, int32_t text_len, int32_t is_partial,
                       char * buf, int32_t buf_size, int32_t * n_out, char * err, size_t err_size);

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
    PLS_MAX_STREAMS = 64,
    PLS_MAX_SCHEDULE = 64,
    PLS_MAX_TRACE = 1048576
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
    /* draft length: adaptive = 1 chooses k in 0..n_max every step and stream from measured costs and
     * acceptance (k = 0 decodes plainly); adaptive = 0 drafts n_max every step */
    int32_t  adaptive;
    /* adaptive = 0 with n_k_schedule > 0: step i drafts k_schedule[i % n_k_schedule] tokens (capped by n_max and the
     * context), 0 meaning a plain step - a fixed cycle of draft lengths for tests and benchmarks */
    int32_t  n_k_schedule;
    int32_t  k_schedule[64];        /* PLS_MAX_SCHEDULE */
    /* synthetic acceptance (speed measurement only: the output is NOT the model's): draft position i is
     * accepted with unconditional probability synth_rates[i] (n_synth_rates values, non-increasing), or with
     * a geometric profile whose mean accepted length (the target's token included) is synth_len (> 0) */
    int32_t  n_synth_rates;
    float    synth_rates[64];
    float    synth_len;
    uint32_t synth_seed;
    /* steps recorded for pls_take_trace (0: none; at most PLS_MAX_TRACE; beyond, steps are counted, not kept) */
    int32_t  trace_steps;
    /* never sample an end-of-generation token (llama.cpp's --ignore-eos: their logits are biased to -inf) */
    int32_t  ignore_eos;
    /* a drafter that reads the target's features (DFlash, DSpark, EAGLE3, MTP) and skipped steps (k = 0) takes in
     * their rows before its next draft, at most catchup_rows per pass: 0 = auto (8 where the drafter runs on a GPU,
     * where up to 8 rows keep the vector kernels and recurring graph shapes; else all at once); after the full
     * passes the rest goes in passes of powers of two */
    int32_t  catchup_rows;
    /* a drafter that reads the target's layer features (DFlash, DSpark, EAGLE3) reads them from the target's device,
     * where the target keeps the latest max(512, n_ubatch) rows of each sequence, when it processes them: a step that
     * drafts nothing copies no features to the host, and a prompt goes in chunks of at most that many tokens (0, the
     * default; where the device has no room for the rows, as 1). 1: the target copies them to the host after every
     * batch, as llama.cpp does; PLS_ERR_INVALID where no drafter reads layer features. pls_session_info.feature_rows
     * says which */
    int32_t  host_features;
    /* a draft model (draft-simple) drafts the best of its top candidates that the sequence's grammar allows
     * (1), or its best candidate whatever the grammar (0); a sequence without a grammar is not affected */
    int32_t  draft_grammar;
    /* greedy rows of the target sampled on the device that holds its output layer (llama.cpp's backend sampling):
     * a row's token and one number come back instead of its logits. -1 auto (on where that device is not the CPU),
     * 0 off, 1 on (PLS_ERR_INVALID where the session's sampling is not greedy). A sequence that asks for
     * log-probabilities, or a session that collects margins, reads raw logits on the host either way */
    int32_t  backend_sampling;
    /* the KV cache's view of the target (and of a draft model) grows in steps of kv_window cells: a graph built for
     * one view serves every batch until the cells in use outgrow it (a GPU re-captures its graphs at each step).
     * 0 = auto (1024 where the target's output layer is on a GPU, else 256), else a power of two 256..65536 */
    int32_t  kv_window;
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
    int32_t adaptive;
    int32_t synthetic;              /* synthetic acceptance: output is not the model's */
    int32_t drafter_kind;           /* PLS_DRAFTER_*: how the controller prices a draft */
    int32_t n_threads;              /* the target context's threads for generation (the drafter's the same) */
    int32_t n_threads_batch;        /* and for prompt processing */
    int32_t catchup_rows;           /* kept rows a feature-reading drafter takes in per pass (0: no such drafter) */
    int32_t feature_rows;           /* rows per sequence the target keeps its layer features in on its device (0: copied to the host) */
    int32_t backend_sampling;       /* 1: greedy rows are sampled on the target's output device */
    int32_t kv_window;              /* the steps in which the target's KV cache view grows (cells) */
} pls_session_info;

/* How a speculative source is priced: a draft model run by the shim token by token (k = 0 skips it
 * entirely and it catches up later), an upstream drafter that runs per token, one that drafts a whole
 * block in one pass, or an n-gram lookup. The last three see every target batch (process) at any k. */
enum {
    PLS_DRAFTER_NONE = 0,
    PLS_DRAFTER_MODEL = 1,
    PLS_DRAFTER_AUTOREGRESSIVE = 2,
    PLS_DRAFTER_BLOCK = 3,
    PLS_DRAFTER_NGRAM = 4
};

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
    /* draft length control */
    int64_t k_hist[65];             /* stream-steps that verified a draft of k tokens (k_hist[0]: plain steps) */
    int64_t n_probes;               /* drafts made while speculation was off, to notice content that drafts well */
    int64_t n_guard;                /* times the ledger turned speculation off (realised speed behind plain) */
    int64_t n_catchup;              /* tokens a draft model caught up after steps without drafting */
    int64_t n_free_drafts;          /* drafts taken from an n-gram lookup beside a draft model (no drafter cost) */
    double  t_process_ms;           /* drafters that read the target's hidden states, after each target batch */
    double  t_sync_ms;              /* waiting for the target's batch to finish on the device (part of t_verify_ms) */
    int64_t n_graph_captures;       /* CUDA/HIP graphs captured during the run (process-wide; 0 on the CPU) */
    int64_t n_graph_resets;         /* graphs invalidated because a batch of another shape came */
    double  est_plain_ms;           /* estimated time plain decoding would have taken for these tokens */
    int64_t n_graph_reused;         /* batches (target and draft model) that ran a graph built earlier, not a new one */
} pls_stats;

/* What the draft-length controller has learnt (costs measured on this machine, acceptance estimates). */
typedef struct pls_adaptive_info {
    int32_t enabled;
    int32_t n_max;
    int32_t depth_bucket;           /* context depth bucket of the last step: [0, 512), [512, 1k), [1k, 2k), ... */
    int32_t n_target_points;        /* target_ms[i] is the fitted cost of a target batch of i + 1 tokens */
    double  target_ms[65];
    double  draft_first_ms;         /* a draft model's first decode of a step (one stream, nothing to catch up) */
    double  draft_token_ms;         /* each further drafted token (one stream) */
    double  draft_call_ms;          /* one call of a drafter that drafts its whole length at once */
    double  catchup_token_ms;       /* per token a draft model catches up */
    int32_t catchup_limit;          /* a draft model further behind restarts from this many recent tokens */
    double  overhead_ms;            /* per step, neither drafting nor the target batch */
    double  cold_ms;                /* a target batch of a size not run in the two steps before it costs this much
                                     * more than in steady runs (on a GPU its graph runs eagerly or is captured) */
    double  hazard[64];             /* P(position i accepted | positions before it were), pooled over streams */
    int32_t n_hazard;
    double  plain_ms_per_token;     /* estimated plain decoding cost at the current depth */
    int32_t last_k[64];             /* the draft length chosen for each stream in the last step */
    int32_t n_streams;
} pls_adaptive_info;

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

/* On PLS_OK, *out holds the session; it holds a reference to target and drafter until it is closed. */
int32_t       pls_session_open(pls_model * target, pls_model * drafter, const pls_session_params * params,
                               pls_session ** out, char * err, size_t err_size);
/* Stops what runs and frees the session once no call uses it; PLS_ERR_BUSY (nothing freed) when called
 * from inside the session's own callback. */
int32_t       pls_session_close(pls_session * session);
int32_t       pls_session_get_info(const pls_session * session, pls_session_info * out);

/* Push style: the whole loop in native code. Returns a PLS_FINISH_* value, or a negative pls_status. */
int32_t pls_generate(pls_session * session, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                     pls_emit_cb callback, void * user_data, char * err, size_t err_size);

/* Pull style: begin, then step until it reports a finish reason. begin returns a pls_status (PLS_ERR_CONTEXT
 * when the prompt does not fit, PLS_ERR_INVALID for an invalid prompt). step returns the number of tokens
 * written (0 at the end), or a negative pls_status; *finish receives PLS_FINISH_*. */
int32_t pls_begin(pls_session * session, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                  char * err, size_t err_size);
int32_t pls_step(pls_session * session, int32_t * tokens, float * margins, int32_t capacity, int32_t * finish,
                 char * err, size_t err_size);

/* Several streams at once (up to n_parallel): their drafts are verified in one target batch per step.
 * prompts holds the n_streams prompts back to back, n_prompt their lengths; each stream gets n_ctx/n_parallel
 * positions. begin_streams returns like pls_begin. step_streams runs one verify step for every active stream and
 * writes stream i's committed tokens (and margins, may be NULL) at row i of tokens[n_streams][capacity], their
 * count to n_tokens[i] and its PLS_FINISH_* to finish[i]; a stream may commit nothing in a step (a checkpoint
 * replay). Returns the number of streams still generating (0: all done), or a negative pls_status. */
int32_t pls_begin_streams(pls_session * session, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams,
                          int32_t n_predict, char * err, size_t err_size);
int32_t pls_step_streams(pls_session * session, int32_t * tokens, float * margins, int32_t capacity,
                         int32_t * n_tokens, int32_t * finish, char * err, size_t err_size);
/* Counters of one stream of the last begin (timings stay in the session's stats: streams share each step).
 * Returns PLS_OK, or PLS_ERR_INVALID for a stream that does not exist. */
int32_t pls_get_stream_stats(const pls_session * session, int32_t stream, pls_stats * out);

/* Continuous batching: sequences join and leave a running batch. pls_seq_add (any thread) queues a prompt with
 * its own sampling and draft settings and returns its slot at once; the next pls_step_seqs processes its prompt in
 * chunks inside the same target batches as the other sequences' verify rows (within n_batch), then it drafts and
 * verifies with them. pls_seq_cancel (any thread) ends a sequence at the next step. A finished sequence's slot -
 * its KV, snapshot ring and draft state - is freed in the step that reports its finish. Not mixed with
 * pls_begin/pls_begin_streams (PLS_ERR_BUSY while the other mode has sequences). */
typedef struct pls_seq_params {
    int32_t  n_predict;             /* -1: until an end-of-generation token or the context is full */
    float    temp;                  /* <= 0: greedy */
    int32_t  top_k;
    float    top_p;
    float    min_p;
    uint32_t seed;
    int32_t  n_max;                 /* this sequence's draft ceiling (<= the session's n_max); -1: the session's */
    int32_t  n_min;                 /* -1: the session's */
    float    p_min;                 /* < 0: the session's */
} pls_seq_params;

typedef struct pls_seq_event {
    int32_t slot;
    int32_t finish;                 /* PLS_FINISH_*: NONE while the sequence goes on */
    int32_t n_tokens;               /* tokens committed in this step */
    int32_t n_drafted;              /* drafted for this sequence in this step */
    int32_t n_accepted;
    int32_t n_prompt;               /* prompt tokens processed in this step */
    int32_t tokens[65];
} pls_seq_event;

int32_t pls_seq_add(pls_session * session, const int32_t * prompt, int32_t n_prompt, const pls_seq_params * params,
                    int32_t * slot, char * err, size_t err_size);
int32_t pls_seq_cancel(pls_session * session, int32_t slot);
/* One step of the running batch. Writes an event for every sequence that processed prompt tokens, committed
 * tokens or finished; returns the number of sequences still in the batch or queued (0: idle), or a negative
 * pls_status. events must hold n_parallel entries. */
int32_t pls_step_seqs(pls_session * session, pls_seq_event * events, int32_t capacity, int32_t * n_events,
                      char * err, size_t err_size);

/* Teacher-forced margins: the target's top-1 minus top-2 logit at every position of continuation, decoded after
 * the prompt in batches of `chunk` tokens (chunk 1 is plain decoding's shape, n_max + 1 a verify batch's). Writes
 * n_cont margins: margins[i] is the margin of the logits that predict continuation[i]. Comparing two chunk sizes
 * measures how far the target's margins move with batch shape alone. Clears the session's generation.
 * Returns a pls_status. */
int32_t pls_score_margins(pls_session * session, const int32_t * prompt, int32_t n_prompt, const int32_t * continuation,
                          int32_t n_cont, int32_t chunk, float * margins, char * err, size_t err_size);

/* Any thread: ends the current generation after the step in flight, or the next one to begin if none runs
 * yet; pls_clear_stop withdraws a request that nothing has consumed. */
void pls_request_stop(pls_session * session);
void pls_clear_stop(pls_session * session);

/* Any thread: the counters as of the last completed step. reset_stats zeroes them (a generation in flight
 * continues counting from zero). */
void pls_get_stats(const pls_session * session, pls_stats * out);
void pls_reset_stats(pls_session * session);
int32_t pls_get_adaptive_info(const pls_session * session, pls_adaptive_info * out);

/* What each step of a generation was and what it cost, as the draft-length controller saw it: for replaying the
 * controller against recorded costs. Recorded when the session was opened with trace_steps > 0. Per stream slot
 * (up to n_streams, the highest slot in the step + 1): in the step or not, the draft length chosen, tokens drafted
 * and accepted, tokens a draft model caught up (or rows a deferred drafter processed before drafting: upstream's
 * drafters that read the target's features keep the rows of steps without a draft and process them at the next),
 * and the context depth. */
typedef struct pls_trace_step {
    int32_t n_streams;
    int32_t active[64];
    int32_t k[64];
    int32_t n_drafted[64];
    int32_t n_accepted[64];
    int32_t n_catchup[64];
    int32_t depth[64];
    uint32_t draft_hash[64];        /* FNV-1a of the stream's drafted tokens (0: none): what the drafter proposed */
    int32_t n_tokens;               /* rows of the target batch */
    int32_t n_prompt;               /* prompt rows among them (continuous batching: the step's costs are not a verify's) */
    int32_t n_draft_iters;          /* a draft model's decodes after its first */
    int32_t n_graph_captures;       /* CUDA/HIP graphs captured during the step (process-wide) */
    double  t_draft_first_ms;       /* a draft model's first decode (catch-up included) */
    double  t_draft_rest_ms;        /* its further decodes */
    double  t_draft_call_ms;        /* an upstream drafter's call, n-gram lookups */
    double  t_target_ms;            /* the target batch, sampled (and the drafters' process of it) */
    double  t_step_ms;              /* the whole step */
} pls_trace_step;
/* Moves up to capacity recorded steps, oldest first, into out and forgets them; returns how many were moved. The
 * steps recorded beyond trace_steps since the last call are counted in *n_dropped (may be NULL). Any thread. */
int32_t pls_take_trace(pls_session * session, pls_trace_step * out, int32_t capacity, int64_t * n_dropped);

/* The draft-length controller alone, for tests and simulations: no models, an injected clock. Costs and
 * acceptance are what observe() is told. choose() writes the draft length per stream (caps[i] bounds it). */
typedef struct pls_controller pls_controller;
typedef struct pls_controller_params {
    int32_t n_max;
    int32_t n_streams;
    int32_t drafter_kind;           /* PLS_DRAFTER_* */
    int32_t adaptive;
    uint32_t seed;
    int32_t kv_window;              /* the steps in which the target's KV cache view grows (cells); 0 = 256 */
} pls_controller_params;
typedef struct pls_step_observation {
    int32_t n_streams;
    const int32_t * k;              /* draft length chosen per stream (0: none) */
    const int32_t * n_drafted;      /* what the drafter delivered (<= k) */
    const int32_t * n_accepted;
    const int32_t * n_catchup;      /* tokens the draft model caught up for this stream before drafting */
    const int32_t * depth;          /* context depth of each stream */
    const int32_t * active;         /* stream took part in the step */
    const int32_t * source;         /* 1: the draft was a free one (an n-gram lookup beside a draft model); may be NULL */
    double  t_draft_first_ms;       /* the draft model's first decode (catch-up included) */
    double  t_draft_rest_ms;        /* its further decodes */
    int32_t n_draft_iters;          /* how many further decodes */
    double  t_draft_call_ms;        /* an upstream drafter's call (autoregressive, block or n-gram) */
    double  t_target_ms;            /* the target batch (and process of hidden-state drafters), sampled */
    double  t_step_ms;              /* the whole step */
} pls_step_observation;
int32_t pls_controller_new(const pls_controller_params * params, pls_controller ** out, char * err, size_t err_size);
void    pls_controller_free(pls_controller * c);
/* pending (may be NULL): tokens each stream's draft model would have to catch up first; free_len (may be NULL):
 * the length of a draft that exists at no cost for a stream (an n-gram match), 0 for none */
int32_t pls_controller_choose(pls_controller * c, const int32_t * caps, const int32_t * depth, const int32_t * active,
                              const int32_t * pending, const int32_t * free_len, int32_t * k_out);
int32_t pls_controller_observe(pls_controller * c, const pls_step_observation * obs);
/* a new prompt in a stream (what a session does at each generation): costs and acceptance evidence stay */
int32_t pls_controller_reset_stream(pls_controller * c, int32_t stream);
int32_t pls_controller_info(const pls_controller * c, pls_adaptive_info * out);
int32_t pls_controller_stats(const pls_controller * c, pls_stats * out);

/* The costs a controller measured on this machine, to seed a later session of the same models and settings (a
 * cache across processes). An import counts each point for at most two measurements, so what the machine
 * measures now soon outweighs it; a target point of count 1 is provisional (that size was seen only in one-off
 * runs, after other sizes), and the size's first steady run replaces it. */
enum {
    PLS_COST_TARGET = 0,            /* a target batch of n_tokens, per depth bucket */
    PLS_COST_DRAFT_FIRST = 1,       /* a draft model's first decode of a step, by tokens in it */
    PLS_COST_DRAFT_REST = 2,        /* its further decodes, by streams still drafting */
    PLS_COST_DRAFT_CALL = 3,        /* an upstream drafter's call */
    PLS_COST_OVERHEAD_PLAIN = 4,    /* per plain step beyond the target batch (n_tokens 0, bucket 0) */
    PLS_COST_OVERHEAD_SPEC = 5,     /* per speculative step beyond drafting and the target batch */
    PLS_COST_COLD = 6,              /* a target batch run cold, beyond its steady cost (n_tokens 0, bucket 0) */
    PLS_COST_WHOLE = 7,             /* a lone stream's whole step, by its draft length (n_tokens: the length; a
                                     * length above the importing session's n_max is not used) */
    PLS_COST_MAX_POINTS = 4096
};
typedef struct pls_cost_point {
    int32_t table;                  /* PLS_COST_* */
    int32_t bucket;                 /* depth bucket, 0..7 */
    int32_t n_tokens;               /* 1..1024; 0 for the overheads */
    int32_t count;                  /* times measured, >= 1 */
    double  ms;
} pls_cost_point;
/* export writes up to capacity points and returns how many there are (call again with more room if that is
 * more), or a negative pls_status; import returns a pls_status (PLS_ERR_INVALID names a bad point, and nothing is
 * imported). The session functions hold the session like any call (PLS_ERR_BUSY while it runs). */
int32_t pls_session_export_costs(pls_session * session, pls_cost_point * out, int32_t capacity, char * err, size_t err_size);
int32_t pls_session_import_costs(pls_session * session, const pls_cost_point * points, int32_t n, char * err, size_t err_size);
int32_t pls_controller_export_costs(const pls_controller * c, pls_cost_point * out, int32_t capacity);
int32_t pls_controller_import_costs(pls_controller * c, const pls_cost_point * points, int32_t n, char * err, size_t err_size);

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
 * without allocating anything (the layer features a drafter reads, kept on the target's device unless host_features,
 * count as context). drafter may be NULL. Returns a pls_status. */
int32_t pls_estimate_memory(const pls_model_params * target, const pls_model_params * drafter,
                            const pls_session_params * params, pls_memory_estimate * out, char * err, size_t err_size);

/* ---- tools ------------------------------------------------------------------------------- */

/* Requantize a GGUF through upstream's quantizer. ftype: a llama_ftype value. tensor_types:
 * "regex=TYPE,..." overrides (e.g. a drafter's selector codebooks at F16), or NULL. progress (may be NULL) is
 * called on the calling thread as each tensor starts, with the tensors done so far and their total.
 * Returns a pls_status. */
typedef void (*pls_progress_cb)(void * user_data, int32_t done, int32_t total);
int32_t pls_quantize(const char * path_in, const char * path_out, int32_t ftype, int32_t n_threads,
                     int32_t allow_requantize, const char * tensor_types, pls_progress_cb progress, void * user_data,
                     char * err, size_t err_size);
/* Name of a llama_ftype value (e.g. "Q4_0"); empty when unknown. */
int32_t pls_ftype_name(int32_t ftype, char * buf, int32_t buf_size);

/* Synthetic models for tests and benchmarks, at any scale. The tensor list comes from upstream's loader: every
 * tensor an arch needs, with its shape, from a GGUF's metadata alone, nothing allocated. The writer streams a GGUF
 * of seeded random values converted to each tensor's type, chunk by chunk on n_threads threads; a value depends on
 * the seed, the tensor name and its index only, so every thread count writes the same bytes. */
enum {
    PLS_SYNTH_WEIGHT = 0,           /* N(0, stddev) */
    PLS_SYNTH_NORM = 1,             /* 1 + N(0, stddev): keeps activations in range through many layers */
    PLS_SYNTH_NEGATIVE = 2          /* -|N(0, stddev)|: a recurrent state's decay */
};

typedef struct pls_synth_tensor {
    const char * name;
    int64_t  ne[4];                 /* ggml order, trailing dimensions 1 */
    int32_t  type;                  /* ggml_type: F32, F16, Q8_0, Q4_0 or Q6_K */
    int32_t  kind;                  /* PLS_SYNTH_* */
} pls_synth_tensor;

typedef struct pls_synth_params {
    uint32_t seed;
    float    stddev;                /* finite, > 0 */
    uint32_t perturb_seed;          /* 0: none; else add N(0, perturb_stddev) (a draft model that agrees often) */
    float    perturb_stddev;
    int32_t  n_threads;             /* <= 0: every core */
} pls_synth_params;

/* Called by the writing thread after each chunk; return non-zero to cancel (the write then returns -2). */
typedef int32_t (*pls_synth_progress_cb)(void * user_data, uint64_t bytes_done, uint64_t bytes_total);

/* The tensors upstream's loader creates for the metadata of meta_path (a GGUF of keys, no tensors) as JSON,
 * [{"name": "...", "ne": [n0, n1, n2, n3]}, ...]. Returns its length, -(needed) when buf is too small, or -1. */
int32_t pls_synth_list_tensors(const char * meta_path, int32_t load_mtp, char * buf, int32_t buf_size,
                               char * err, size_t err_size);
/* Write meta_path's keys and these tensors with random values as a GGUF at path_out (truncated first).
 * Returns 0, -2 when progress cancelled it, or -1 with a message. */
int32_t pls_synth_write(const char * meta_path, const pls_synth_tensor * tensors, int32_t n_tensors,
                        const pls_synth_params * params, const char * path_out, pls_synth_progress_cb progress,
                        void * user_data, char * err, size_t err_size);

/* ---- sampling beyond temperature and truncation ------------------------------------------ */

/* A sequence's grammar, repetition penalties, logit biases and log-probabilities. They go through upstream's
 * common_sampler in the verify: a drafted token that the grammar (or a ban) forbids is rejected there, so the
 * output is non-speculative decoding's. A session's greedy fast path (argmax) steps aside for a sequence that
 * sets any of them. */
enum {
    PLS_MAX_TOP_LOGPROBS = 20
};

typedef struct pls_logit_bias {
    int32_t token;
    float   bias;                   /* added to the token's logit; -INFINITY bans it */
} pls_logit_bias;

/* Where a lazy grammar starts to apply (a chat template's tool-call format): the text before the first trigger is
 * free, the grammar holds from the trigger on (llama.cpp's grammar triggers). */
enum {
    PLS_TRIGGER_TOKEN = 0,          /* the token `token` */
    PLS_TRIGGER_WORD = 1,           /* the text `value` */
    PLS_TRIGGER_PATTERN = 2,        /* a regular expression (ECMAScript) matching the output so far, anywhere */
    PLS_TRIGGER_PATTERN_FULL = 3    /* a regular expression matching the whole output so far */
};

typedef struct pls_grammar_trigger {
    int32_t      type;              /* PLS_TRIGGER_* */
    const char * value;             /* the word or pattern (NULL for a token) */
    int32_t      token;             /* the token of PLS_TRIGGER_TOKEN */
} pls_grammar_trigger;

typedef struct pls_sampling_params {
    const char * grammar;           /* GBNF (llama.cpp's grammar format, rule "root"); NULL or "": none */
    float    penalty_repeat;        /* 1: off (llama.cpp's --repeat-penalty) */
    float    penalty_freq;          /* 0: off (OpenAI's frequency_penalty) */
    float    penalty_present;       /* 0: off (OpenAI's presence_penalty) */
    int32_t  penalty_last_n;        /* tokens the penalties look back on, the prompt's included; -1: the context */
    const pls_logit_bias * logit_bias;
    int32_t  n_logit_bias;
    int32_t  n_probs;               /* -1: no log-probabilities; 0..PLS_MAX_TOP_LOGPROBS: each committed token's
                                     * log-probability and this many of the most likely alternatives */
    const pls_grammar_trigger * triggers;  /* given (n_triggers > 0): the grammar is lazy, it applies from the first */
    int32_t  n_triggers;
} pls_sampling_params;

/* A committed token's log-probability under the target's distribution at its position (log-softmax of the raw
 * logits, before any sampler), and the n_top most likely tokens there, most likely first. */
typedef struct pls_token_logprob {
    int32_t token;
    float   logprob;
    int32_t n_top;
    int32_t top_token[20];          /* PLS_MAX_TOP_LOGPROBS */
    float   top_logprob[20];
} pls_token_logprob;

/* A grammar's GBNF from a JSON schema, through upstream's converter (llama.cpp's --json-schema). Returns PLS_OK
 * with the grammar's length in *n_out: the grammar and a NUL are in buf when *n_out < buf_size, else buf is
 * untouched and the call can be repeated with *n_out + 1 bytes. PLS_ERR_INVALID when the text is not JSON or the
 * converter refuses the schema (err says why). */
int32_t pls_json_schema_to_grammar(const char * schema, char * buf, int32_t buf_size, int32_t * n_out,
                                   char * err, size_t err_size);
/* PLS_OK when the grammar parses and has a "root" rule for this model's vocabulary; PLS_ERR_INVALID naming the
 * problem otherwise. */
int32_t pls_grammar_check(const pls_model * model, const char * grammar, char * err, size_t err_size);
/* The sampling of the sequences a begin (pls_generate, pls_begin, pls_begin_streams) starts; NULL: none. Holds
 * the session like any call. */
int32_t pls_session_set_sampling(pls_session * session, const pls_sampling_params * sampling, char * err,
                                 size_t err_size);
/* pls_seq_add with a sampling (NULL: none); PLS_ERR_INVALID names a setting that cannot be honoured. */
int32_t pls_seq_add_sampling(pls_session * session, const int32_t * prompt, int32_t n_prompt,
                             const pls_seq_params * params, const pls_sampling_params * sampling, int32_t * slot,
                             char * err, size_t err_size);
/* The log-probabilities of the tokens a stream (a slot, or a stream of the last begin) committed in the last step,
 * in the order of its tokens, for a sequence whose n_probs >= 0; returns how many there are (at most capacity
 * are written), or a negative pls_status. Read after the step and before the next. */
int32_t pls_step_logprobs(pls_session * session, int32_t stream, pls_token_logprob * out, int32_t capacity);

/* ---- remote devices (ggml RPC) ----------------------------------------------------------- */

/* Connect to rpc-servers ("HOST:PORT,HOST:PORT", IPv4) and add their devices (RPC0, RPC1, ... in the order given) to
 * the process's device list, after the local ones; placement (devices, tensor split) and the memory estimate see
 * them like local ones. An endpoint added before is not connected again. timeout_ms (1..3600000) bounds connecting
 * to each host and its handshake. Returns a pls_status: PLS_ERR_INVALID for a malformed list, PLS_ERR_REMOTE naming
 * a host that cannot be reached or does not answer (those before it stay added). A session on a model that uses a
 * remote device that failed later (the host went away) fails every call with PLS_ERR_REMOTE: it is unusable. */
int32_t pls_rpc_add_servers(const char * endpoints, int32_t timeout_ms, char * err, size_t err_size);
/* JSON text: [{"endpoint": "...", "devices": ["RPC0"], "failed": false, "error": ""}, ...] for the servers added.
 * Returns its length, or -(needed) when buf is too small. */
int32_t pls_rpc_servers_json(char * buf, int32_t buf_size);
/* Whether a session can still run: PLS_OK, or PLS_ERR_REMOTE with the failed remote device named. */
int32_t pls_session_health(pls_session * session, char * err, size_t err_size);
/* The device a model of these parameters would hold its output layer (LM head) on ("CPU" for host memory), found by
 * upstream's loader without allocating anything. Returns a pls_status. */
int32_t pls_plan_head_device(const pls_model_params * params, char * out, int32_t out_size, char * err, size_t err_size);

/* ---- embeddings ------------------------------------------------------------------------------ */

typedef struct pls_embedder pls_embedder;

/* Pooling of a sequence's token embeddings into one vector: the values of upstream's llama_pooling_type. */
enum {
    PLS_POOLING_MODEL = -1,         /* the model's (its GGUF's pooling_type); mean when it names none */
    PLS_POOLING_MEAN = 1,
    PLS_POOLING_CLS = 2,
    PLS_POOLING_LAST = 3
};

typedef struct pls_embed_params {
    int32_t n_ctx;                  /* the longest input in tokens; it is decoded in one batch (1..n_ctx_train) */
    int32_t n_threads;              /* 0: the CPU cores useful for math */
    int32_t pooling;                /* PLS_POOLING_* */
    int32_t normalize;              /* 1: each vector scaled to unit L2 norm (llama-server's /v1/embeddings), 0: raw */
} pls_embed_params;

typedef struct pls_embedder_info {
    int32_t n_embd;                 /* floats per vector */
    int32_t n_ctx;                  /* the longest input */
    int32_t pooling;                /* the pooling used (PLS_POOLING_MEAN, _CLS or _LAST) */
} pls_embedder_info;

/* An embedder: its own llama.cpp context over a model (embeddings on, pooled), apart from every session, so
 * generation is unaffected. It holds the model (pls_model_free only drops the caller's reference). Calls may come
 * from several threads: they run one at a time. PLS_ERR_INVALID for bad parameters or a model that cannot embed
 * (a reranker's rank pooling); PLS_ERR_MEMORY when the context cannot be allocated. */
int32_t pls_embedder_open(pls_model * model, const pls_embed_params * params, pls_embedder ** out, char * err,
                          size_t err_size);
void    pls_embedder_free(pls_embedder * embedder);
int32_t pls_embedder_get_info(const pls_embedder * embedder, pls_embedder_info * out);
/* Embeds n_inputs token sequences: the tokens of input i follow those of input i - 1 in tokens, n_tokens[i] of
 * them; out receives n_inputs * n_embd floats. PLS_ERR_INVALID for an empty input or a token outside the vocabulary
 * (err names the input), PLS_ERR_CONTEXT for an input longer than n_ctx, PLS_ERR_DECODE when llama.cpp fails. */
int32_t pls_embed(pls_embedder * embedder, const int32_t * tokens, const int32_t * n_tokens, int32_t n_inputs,
                  float * out, char * err, size_t err_size);

/* PLS_CDEF_END */

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* PYLLAMASPEC_H */
