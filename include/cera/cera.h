/*
 * cera.h: the C API of cera, for programs in C and for any language with a C FFI.
 *
 * A thin, stable layer over the C++ API (engine.h, session.h, batcher.h, grammar.h):
 *
 *     cera_engine *engine = NULL;
 *     cera_engine_options eo = cera_engine_default_options();
 *     eo.device = "cpu";
 *     if (cera_engine_load("model.gguf", &eo, &engine) != CERA_OK) {
 *         fprintf(stderr, "%s\n", cera_last_error());
 *         return 1;
 *     }
 *     cera_session *s = NULL;
 *     cera_session_new(engine, 0, &s);
 *     cera_session_append_text(s, "Once upon a time", true);
 *     cera_generate_options g = cera_generate_default_options();
 *     g.max_tokens = 32;
 *     g.sampling.temperature = 0.0f;  // greedy
 *     cera_session_generate(s, &g, print_piece, NULL, NULL);
 *     cera_session_free(s);
 *     cera_engine_free(engine);
 *
 * Conventions
 *   - Every function that can fail returns a cera_status. On failure the calling thread's
 *     last-error message (cera_last_error()) says what went wrong; outputs are left untouched
 *     (but for the size a short buffer needed, below).
 *     No C++ exception ever leaves a cera_* function.
 *   - Handles are opaque. A cera_session or cera_batcher keeps its engine alive, so handles may be
 *     freed in any order. Every *_free function accepts NULL.
 *   - Text is UTF-8, NUL-terminated unless a length comes with it.
 *   - Variable-size results are copied into caller buffers: the function stores the size of the
 *     result (*n_out items, or *len_out bytes of text) and returns CERA_ERR_BUFFER_TOO_SMALL when
 *     `capacity` is short, so that a call with capacity 0 asks for the size. Text is always
 *     NUL-terminated, so a text buffer needs *len_out + 1 bytes; *len_out never counts the NUL.
 *   - Option structs come from their cera_*_default_options() and are then edited field by field,
 *     so that fields added later get their defaults in old code recompiled against a new header.
 *   - Threads: an engine may be shared by any number of threads; one thread at a time drives a
 *     session (cera_session_cancel() excepted); batcher and request functions are thread-safe.
 *
 * ABI: CERA_ABI_VERSION changes whenever a struct layout or a function signature changes;
 * cera_abi_version() is the value the library was built with. A program built against a header
 * whose CERA_ABI_VERSION differs from the library's must not use it.
 */
#ifndef CERA_H
#define CERA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#    define CERA_API
#else
#    define CERA_API __attribute__((visibility("default")))
#endif

#define CERA_ABI_VERSION 2

/* Tokens are vocabulary ids; CERA_TOKEN_NULL means "none". */
#define CERA_TOKEN_NULL (-1)

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t cera_token;

/* Opaque handles. */
typedef struct cera_engine cera_engine;        /* a loaded model on a device */
typedef struct cera_tokenizer cera_tokenizer;  /* an engine's tokenizer (borrowed from the engine) */
typedef struct cera_session cera_session;      /* one sequence: KV cache and recurrent state */
typedef struct cera_grammar cera_grammar;      /* a constraint on generated text */
typedef struct cera_batcher cera_batcher;      /* many sequences generated together */
typedef struct cera_request cera_request;      /* one request of a batcher */

/*
 * Version and errors
 */

/* The library's version, e.g. "0.1.0". */
CERA_API const char *cera_version(void);
/* The CERA_ABI_VERSION the library was built with. */
CERA_API int cera_abi_version(void);

typedef enum cera_status {
    CERA_OK = 0,
    CERA_ERR_INVALID_ARGUMENT = 1, /* a bad option or argument (a NULL handle, a bad value) */
    CERA_ERR_IO = 2,               /* a file could not be opened, read or written */
    CERA_ERR_INVALID_FILE = 3,     /* a malformed GGUF, state file or other data */
    CERA_ERR_UNSUPPORTED = 4,      /* a valid input this build cannot handle (architecture, type) */
    CERA_ERR_MISSING = 5,          /* a required key or tensor is absent */
    CERA_ERR_OUT_OF_RANGE = 6,     /* a value outside its range (token id, context length) */
    CERA_ERR_PARSE = 7,            /* a template, grammar or JSON that does not parse */
    CERA_ERR_DEVICE = 8,           /* no such device, or the device failed */
    CERA_ERR_CANCELLED = 9,        /* the operation was cancelled */
    CERA_ERR_OVER_CAPACITY = 10,   /* no room now (a full queue); may succeed later */
    CERA_ERR_BUFFER_TOO_SMALL = 11,/* the caller's buffer is short; the size needed was stored */
    CERA_ERR_OUT_OF_MEMORY = 12,   /* an allocation failed */
    CERA_ERR_INTERNAL = 13,        /* anything else (a bug: please report it) */
} cera_status;

/* A short name of a status, e.g. "invalid file". Never NULL. */
CERA_API const char *cera_status_name(cera_status status);
/* The message of the last failing cera_* call on this thread ("" when none has failed). The
 * pointer stays valid until the next failing call on this thread. */
CERA_API const char *cera_last_error(void);
/* Frees memory the library allocated for the caller (cera_session_save_state). NULL is fine. */
CERA_API void cera_free(void *ptr);

/*
 * Engine: a loaded model
 */

/* KV cache storage (keys and values alike): floats, or blocks of 32 with one scale (8-bit, 4-bit), or
 * 4-bit (TQ4) or 3.5-bit (TQ3) blocks of each head through a fixed random rotation, or KIVI's layout
 * (KIVI4: keys 4-bit per channel over 64 tokens, values 4-bit per token; CPU only). The block types and
 * KIVI4 need rows of K and V of a multiple of 32; on CUDA, heads of a multiple of 32 (TQ4, TQ3: a power
 * of two). */
typedef enum cera_kv_type {
    CERA_KV_F32 = 0,
    CERA_KV_F16 = 1,
    CERA_KV_BF16 = 2,
    CERA_KV_Q8_0 = 3,
    CERA_KV_Q4_0 = 4,
    CERA_KV_TQ4 = 5,
    CERA_KV_TQ3 = 6,
    CERA_KV_KIVI4 = 7,
} cera_kv_type;

/* A LoRA adapter: a llama.cpp GGUF LoRA file or a Hugging Face PEFT folder (adapter_config.json and
 * adapter_model.safetensors), and the scale its deltas are applied with:
 * y = W x + scale * (alpha / r) * B (A x). */
typedef struct cera_lora_adapter {
    const char *path;
    float scale; /* 1 = as trained */
} cera_lora_adapter;

typedef struct cera_engine_options {
    const char *device;              /* "auto" (a CUDA GPU when usable, else the CPU), "cpu", "cuda", "cuda:N"; NULL = "auto" */
    int32_t threads;                 /* CPU worker threads; 0 = the physical cores */
    int32_t n_ctx;                   /* context of each session; 0 = the model's, at most 4096 */
    cera_kv_type kv_type;            /* KV cache storage */
    int32_t n_batch;                 /* prefill chunk in tokens */
    uint64_t prefix_cache_bytes;     /* in-memory prefix cache bound; 0 = none */
    const char *prefix_cache_dir;    /* on-disk prefix cache directory; NULL or "" = none */
    uint64_t prefix_cache_dir_bytes; /* on-disk bound; 0 = 4 GiB */
    bool gpu_profile;                /* CUDA: print GPU and host time per decode step when the engine goes */
    /* A vision projector GGUF (llama.cpp's mmproj of an LFM2-VL model), loaded onto the model's device:
     * sessions and batcher requests then take images. NULL or "" = none. */
    const char *mmproj;
    /* n_lora LoRA adapters applied together to every session, and to every batcher request that names no
     * adapter (cera_generate_options.adapter). Loaded with the model: a bad one fails cera_engine_load().
     * NULL when n_lora is 0. */
    const cera_lora_adapter *lora;
    size_t n_lora;
    /* Device bytes of adapter weights kept resident while no step uses them (least recently used go
     * first beyond it); 0 = no bound. */
    size_t lora_cache_bytes;
    /* Called from the loading thread as the weights go onto the device, with the tensor bytes loaded so
     * far and in all (the last call has them equal) and load_progress_user_data. NULL = none. */
    void (*load_progress)(uint64_t done, uint64_t total, void *user_data);
    void *load_progress_user_data;
} cera_engine_options;

/* The defaults: device "auto", threads 0, n_ctx 0, F32 KV cache, n_batch 512, no prefix cache, no
 * projector, no adapters, no progress callback. */
CERA_API cera_engine_options cera_engine_default_options(void);

/* Loads a GGUF model and makes its weights resident on the chosen device. options NULL: the
 * defaults. On success *out is a new engine to free with cera_engine_free().
 * Errors: CERA_ERR_IO (no such file), CERA_ERR_INVALID_FILE, CERA_ERR_UNSUPPORTED,
 * CERA_ERR_DEVICE, CERA_ERR_INVALID_ARGUMENT (bad options). */
CERA_API cera_status cera_engine_load(const char *path, const cera_engine_options *options, cera_engine **out);
/* Releases the caller's reference; the model goes when its last session and batcher are freed. */
CERA_API void cera_engine_free(cera_engine *engine);

/* What a loaded model is and where it runs. The strings belong to the engine. */
typedef struct cera_model_info {
    const char *path;         /* the GGUF file */
    const char *architecture; /* general.architecture, e.g. "lfm2" */
    const char *name;         /* general.name, or "" */
    const char *weight_type;  /* the type holding most weight bytes, e.g. "Q8_0" */
    const char *device;       /* the backend, e.g. "cpu avx512, 2 threads" */
    bool on_gpu;              /* the weights live on a CUDA device */
    bool has_chat_template;   /* the GGUF carries tokenizer.chat_template */
    int64_t n_params;         /* elements of all weight tensors */
    uint64_t weight_bytes;    /* bytes of all weight tensors */
    uint64_t decode_bytes_per_token; /* weight bytes one batch-1 decode step reads (the roofline's numerator) */
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_ctx_train;      /* the context the model was trained with */
    int32_t n_ctx;            /* the context of each session */
} cera_model_info;

/* The model's facts; the pointer and its strings stay valid while the engine lives (NULL for a
 * NULL engine). */
CERA_API const cera_model_info *cera_engine_info(const cera_engine *engine);
/* A GGUF metadata value as text (strings as stored, numbers in decimal, arrays as "[N items]").
 * CERA_ERR_MISSING when the key is absent. Buffer convention as above. */
CERA_API cera_status cera_engine_metadata(const cera_engine *engine, const char *key, char *buf, size_t capacity,
                                          size_t *len_out);
/* The number of metadata keys, and the i-th key in file order (buffer convention as above). */
CERA_API size_t cera_engine_metadata_count(const cera_engine *engine);
CERA_API cera_status cera_engine_metadata_key(const cera_engine *engine, size_t i, char *buf, size_t capacity,
                                              size_t *len_out);
/* A hash of the GGUF: saved states load only into an engine with the same fingerprint. */
CERA_API uint64_t cera_engine_fingerprint(const cera_engine *engine);

/* Device memory the engine's backend holds, in bytes (all zero on the CPU). */
typedef struct cera_device_memory {
    uint64_t weights; /* the weights as stored on the device */
    uint64_t buffers; /* KV caches, recurrent states, activations, outputs */
    uint64_t scratch; /* the backend's working memory */
} cera_device_memory;
CERA_API cera_status cera_engine_device_memory(const cera_engine *engine, cera_device_memory *out);

/* Counters of the engine's prefix cache (zeros without one). */
typedef struct cera_prefix_cache_stats {
    uint64_t hits_memory, hits_disk, misses;
    uint64_t stores;          /* entries added */
    uint64_t evictions;       /* in-memory entries evicted by the byte bound */
    uint64_t disk_evictions;  /* files removed by the disk bound */
    uint64_t dropped_corrupt; /* torn or corrupt files removed instead of loaded */
    uint64_t memory_entries, memory_bytes;
} cera_prefix_cache_stats;
CERA_API cera_status cera_engine_prefix_cache_stats(const cera_engine *engine, cera_prefix_cache_stats *out);

/* The engine's tokenizer; valid while the engine lives. */
CERA_API const cera_tokenizer *cera_engine_tokenizer(const cera_engine *engine);

/*
 * LoRA adapters: named adapters, added and removed while the engine runs (from any thread). A session's
 * generation or a batcher request picks one by name (cera_generate_options.adapter).
 */

/* Reads an adapter and checks it against the model. scale as in cera_lora_adapter. Errors: CERA_ERR_IO
 * (no such file), CERA_ERR_INVALID_FILE (not an adapter, or one of another model: the message names the
 * tensor and both shapes), CERA_ERR_UNSUPPORTED, CERA_ERR_INVALID_ARGUMENT (a name in use, "" or "base"). */
CERA_API cera_status cera_engine_load_adapter(cera_engine *engine, const char *name, const char *path, float scale);
/* Removes a named adapter; generations already running with it finish with it. CERA_ERR_MISSING when
 * there is no adapter by that name. */
CERA_API cera_status cera_engine_unload_adapter(cera_engine *engine, const char *name);

/* A named adapter. */
typedef struct cera_adapter_info {
    const char *name;
    const char *path;
    float scale;
    int64_t n_tensors; /* adapted projections */
    int64_t rank;      /* the largest rank among them */
} cera_adapter_info;

/* The number of named adapters, and the i-th in name order. The strings of *out stay valid until the
 * next cera_engine_adapter_info() call on this thread. A load or unload on another thread between the
 * two calls shifts the indexes: CERA_ERR_OUT_OF_RANGE then says that i is past the end. */
CERA_API size_t cera_engine_adapter_count(const cera_engine *engine);
CERA_API cera_status cera_engine_adapter_info(const cera_engine *engine, size_t i, cera_adapter_info *out);

/*
 * Images (an engine loaded with cera_engine_options.mmproj)
 *
 * A session takes an image directly (cera_session_append_image). A batcher prompt carries encoded images
 * (cera_image) at "<image>" marker tokens: render the conversation with "<image>" where each image goes
 * (as LFM2-VL's chat template does), tokenize it with parse_special, and pass the images in the same order
 * to cera_batcher_submit_images().
 */

typedef struct cera_image cera_image; /* an image decoded and encoded by an engine's vision projector */

/* Whether the engine has a vision projector. */
CERA_API bool cera_engine_has_vision(const cera_engine *engine);
/* Decodes an image file's bytes (PNG, JPEG, WebP, GIF's first frame or BMP) and encodes it with the vision
 * projector. The latest few images are kept by content, so a repeated one is not encoded again. On
 * success *out is a new image to free with cera_image_free(); it keeps its engine alive. Errors:
 * CERA_ERR_INVALID_ARGUMENT (not an image, truncated, too large; an engine without a projector). */
CERA_API cera_status cera_engine_encode_image(cera_engine *engine, const uint8_t *data, size_t size,
                                              cera_image **out);
/* An image may be freed while requests that use it run (they hold their own reference). */
CERA_API void cera_image_free(cera_image *image);
/* The tokens that stand for the image in a prompt: <|image_start|>, tile markers, one image token per
 * embedding row, <|image_end|>. Their count is the context the image takes. Buffer convention as above. */
CERA_API cera_status cera_image_tokens(const cera_image *image, cera_token *tokens, size_t capacity, size_t *n_out);
/* The id of the "<image>" marker token, or CERA_TOKEN_NULL when the model has none. */
CERA_API cera_token cera_engine_image_marker(const cera_engine *engine);

/*
 * Tokenizer
 */

/* Text -> token ids. add_bos: add BOS (and EOS) where the model's tokenizer settings ask for them;
 * parse_special: special-token text such as "<|im_start|>" becomes its single id. Stores the
 * count in *n_out; CERA_ERR_BUFFER_TOO_SMALL when it exceeds capacity (tokens may be NULL then). */
CERA_API cera_status cera_tokenize(const cera_tokenizer *tokenizer, const char *text, size_t text_len, bool add_bos,
                                   bool parse_special, cera_token *tokens, size_t capacity, size_t *n_out);
/* Token ids -> text (special tokens as their text when render_special). Buffer convention as above. */
CERA_API cera_status cera_detokenize(const cera_tokenizer *tokenizer, const cera_token *tokens, size_t n_tokens,
                                     bool render_special, char *buf, size_t capacity, size_t *len_out);
/* The text a token id has in the vocabulary (special tokens included), e.g. "<|im_end|>". */
CERA_API cera_status cera_token_text(const cera_tokenizer *tokenizer, cera_token token, char *buf, size_t capacity,
                                     size_t *len_out);
/* The bytes a token adds to a decoded text (a space for a leading '\u2581', <0xNN> as that byte;
 * control tokens give none); part of a UTF-8 character for byte tokens, so the buffer is raw bytes
 * (still NUL-terminated). */
CERA_API cera_status cera_token_bytes(const cera_tokenizer *tokenizer, cera_token token, char *buf, size_t capacity,
                                      size_t *len_out);
CERA_API int32_t cera_tokenizer_n_vocab(const cera_tokenizer *tokenizer);
CERA_API cera_token cera_token_bos(const cera_tokenizer *tokenizer); /* CERA_TOKEN_NULL when none */
CERA_API cera_token cera_token_eos(const cera_tokenizer *tokenizer); /* CERA_TOKEN_NULL when none */
/* Whether the model wants BOS at the start of a sequence. */
CERA_API bool cera_tokenizer_add_bos(const cera_tokenizer *tokenizer);
/* End of generation: EOS, EOT, EOM and the like. */
CERA_API bool cera_token_is_eog(const cera_tokenizer *tokenizer, cera_token token);

/*
 * Chat templates
 */

/* One message of a conversation (OpenAI style). */
typedef struct cera_chat_message {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content;
} cera_chat_message;

/* Renders a conversation with a chat template (Jinja, as Hugging Face's apply_chat_template):
 * template_source NULL = the model's tokenizer.chat_template, or ChatML when the model has none.
 * add_generation_prompt ends the text with the assistant header. The model's BOS and EOS texts are
 * the template's bos_token and eos_token. Errors: CERA_ERR_PARSE (template), CERA_ERR_INVALID_ARGUMENT
 * (raise_exception() in the template). Buffer convention as above. */
CERA_API cera_status cera_chat_apply_template(const cera_engine *engine, const char *template_source,
                                              const cera_chat_message *messages, size_t n_messages,
                                              bool add_generation_prompt, char *buf, size_t capacity,
                                              size_t *len_out);

/*
 * Grammars (structured output)
 */

/* GBNF text (as llama.cpp writes it); root NULL = "root". CERA_ERR_PARSE names the line. */
CERA_API cera_status cera_grammar_from_gbnf(const char *gbnf, const char *root, cera_grammar **out);
/* JSON text that a JSON Schema (the subset in docs/grammar.md) accepts. */
CERA_API cera_status cera_grammar_from_json_schema(const char *schema_json, cera_grammar **out);
/* JSON mode: any JSON object (any_value: any JSON value). */
CERA_API cera_status cera_grammar_json(bool any_value, cera_grammar **out);
/* A lazy grammar: generation is free until the text contains the trigger; from the trigger's first byte
 * on, the text must match the GBNF (which starts with the trigger): tool calls with tool_choice "auto".
 * Errors as cera_grammar_from_gbnf, and CERA_ERR_INVALID_ARGUMENT for an empty trigger. */
CERA_API cera_status cera_grammar_lazy(const char *gbnf, const char *trigger, cera_grammar **out);
/* A lazy grammar's trigger ("" for one that applies from the first byte). Buffer convention as above. */
CERA_API cera_status cera_grammar_trigger(const cera_grammar *grammar, char *buf, size_t capacity, size_t *len_out);
/* The GBNF of a JSON Schema (what cera_grammar_from_json_schema parses). Buffer convention as above. */
CERA_API cera_status cera_json_schema_to_gbnf(const char *schema_json, char *buf, size_t capacity, size_t *len_out);
/* The grammar as GBNF text. */
CERA_API cera_status cera_grammar_gbnf(const cera_grammar *grammar, char *buf, size_t capacity, size_t *len_out);
/* Matches a whole text: *where = -1 when it is in the grammar's language, else the byte offset where
 * matching stops (text_len when the text is a proper prefix of something in the language). */
CERA_API cera_status cera_grammar_match(const cera_grammar *grammar, const char *text, size_t text_len, int64_t *where);
/* A grammar may be freed while generations that use it run (they hold their own reference). */
CERA_API void cera_grammar_free(cera_grammar *grammar);

/*
 * Generation options, results and the token callback
 */

typedef struct cera_logit_bias {
    cera_token token;
    float bias; /* added to the raw logit (-100 all but bans the token, +100 all but forces it) */
} cera_logit_bias;

/* The sampler chain: logit bias -> penalties -> top-k -> top-p -> min-p -> temperature -> draw. */
typedef struct cera_sampling_params {
    float temperature;       /* <= 0: greedy (arg-max, no random draw) */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off */
    float frequency_penalty; /* 0: off */
    float presence_penalty;  /* 0: off */
    int32_t penalty_last_n;  /* tokens the penalties look back over; 0: off */
    uint64_t seed;           /* same seed, same logits -> same tokens */
    const cera_logit_bias *logit_bias; /* n_logit_bias entries, or NULL */
    size_t n_logit_bias;
} cera_sampling_params;

typedef struct cera_generate_options {
    int32_t max_tokens;           /* tokens to sample at most; < 0: until EOS, a stop string or a full context;
                                     0: evaluate the queued tokens only */
    cera_sampling_params sampling;
    const char *const *stop;      /* n_stop stop strings, or NULL */
    size_t n_stop;
    bool ignore_eos;              /* keep going past end-of-generation tokens */
    int32_t n_keep;               /* >= 0: shift the context when it fills, keeping the first n_keep tokens;
                                     < 0: finish with CERA_FINISH_CONTEXT_FULL */
    int32_t logprobs;             /* >= 0: report each token's log-probability and this many most likely
                                     tokens in cera_token_event; < 0: none */
    const cera_grammar *grammar;  /* structured output, or NULL */
    bool device_greedy;           /* take greedy picks on the device (the same tokens, less copying) */
    bool device_sampling;         /* select top-k candidates on the device (the same tokens) */
    int32_t decode_ahead;         /* -1: when the device runs behind the host; 0: never; 1: always */
    /* LoRA adapter: NULL or "" = the engine's default adapters (cera_engine_options.lora), "base" = none,
     * otherwise the name of an adapter loaded with cera_engine_load_adapter() (CERA_ERR_MISSING when
     * there is none by that name). A session whose adapter changes evaluates its tokens again under the
     * new one. */
    const char *adapter;
    const void *reserved[3];      /* must stay NULL */
} cera_generate_options;

/* The defaults of the C++ API: sampling at temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
 * seed 0, no stop strings, max_tokens -1, n_keep -1, logprobs -1. */
CERA_API cera_generate_options cera_generate_default_options(void);

typedef enum cera_finish_reason {
    CERA_FINISH_NONE = 0,
    CERA_FINISH_EOS = 1,          /* the model produced an end-of-generation token */
    CERA_FINISH_STOP = 2,         /* a stop string appeared, or the grammar is complete */
    CERA_FINISH_LENGTH = 3,       /* max_tokens reached */
    CERA_FINISH_CONTEXT_FULL = 4, /* no room for another token */
    CERA_FINISH_CANCELLED = 5,    /* cancelled, or the callback returned false */
} cera_finish_reason;

/* "none", "eos", "stop", "length", "context", "cancelled". */
CERA_API const char *cera_finish_reason_name(cera_finish_reason reason);

typedef struct cera_token_logprob {
    cera_token token;
    float logprob;
} cera_token_logprob;

/* What the callback receives for each sampled token. */
typedef struct cera_token_event {
    cera_token token;        /* the sampled id; CERA_TOKEN_NULL for text released when generation ends,
                                after the last token's event */
    const char *text;        /* the text that became final with this token (not NUL-terminated); it may be
                                empty: text that could start a stop string or ends in an unfinished UTF-8
                                character is held back and comes with a later event */
    size_t text_len;
    float logprob;           /* the token's log-probability (options.logprobs >= 0), else 0 */
    const cera_token_logprob *top; /* the options.logprobs most likely tokens, most likely first, else NULL */
    int32_t n_top;
} cera_token_event;

/* Called on the generating thread (for a batcher request: the batcher's thread) once per event.
 * Return true to go on, false to stop: the generation then finishes with CERA_FINISH_CANCELLED
 * and no further event comes. The event and its pointers are valid during the call only. */
typedef bool (*cera_token_callback)(const cera_token_event *event, void *user_data);

typedef struct cera_generation_result {
    cera_finish_reason finish;
    int32_t prompt_tokens;    /* tokens evaluated before the first sample */
    int32_t generated_tokens; /* tokens sampled, a final EOS included */
    int32_t decode_steps;     /* single-token forward passes */
    int32_t cached_tokens;    /* prompt tokens restored from the prefix cache */
    int32_t context_shifts;   /* context shifts made to keep generating */
    double prefill_seconds;
    double decode_seconds;
    /* All generated text (NUL-terminated; text_len excludes the NUL) and the stop string that ended
     * it (""). Both belong to the session (or request) and stay valid until its next generation or
     * its free. */
    const char *text;
    size_t text_len;
    const char *stop_string;
} cera_generation_result;

/*
 * Session: one sequence on an engine
 */

/* A new, empty sequence; n_ctx 0 = the engine's context. The session keeps the engine alive. */
CERA_API cera_status cera_session_new(cera_engine *engine, int32_t n_ctx, cera_session **out);
CERA_API void cera_session_free(cera_session *session);

/* Tokenizes text and queues it (evaluated by the next generate). BOS is prepended when the session
 * is empty and the model wants it. CERA_ERR_OUT_OF_RANGE when it does not fit the context (the
 * session is then unchanged). */
CERA_API cera_status cera_session_append_text(cera_session *session, const char *text, bool parse_special);
/* As above with an explicit choice: add_bos prepends the model's BOS token (if it has one) even when
 * the model does not ask for it, or leaves it out. Only honoured when the session is empty. */
CERA_API cera_status cera_session_append_text_bos(cera_session *session, const char *text, bool add_bos,
                                                  bool parse_special);
/* Queues token ids. CERA_ERR_OUT_OF_RANGE for an id outside the vocabulary or when they do not fit. */
CERA_API cera_status cera_session_append_tokens(cera_session *session, const cera_token *tokens, size_t n_tokens);
/* Renders the conversation with the model's chat template (as cera_chat_apply_template with
 * add_generation_prompt), tokenizes it and queues it; BOS added where the model wants one and the
 * template did not write it. Meant for an empty session: a new turn re-renders the whole
 * conversation (reset first, or truncate to the common prefix). */
CERA_API cera_status cera_session_append_chat(cera_session *session, const cera_chat_message *messages,
                                              size_t n_messages);

/* Queues an image given as the bytes of its file (PNG, JPEG, WebP, GIF's first frame or BMP): the vision
 * projector encodes it and its tokens (as cera_image_tokens) join the sequence, its embeddings standing in
 * for its image tokens. BOS is prepended as for text. Errors (the session is then unchanged):
 * CERA_ERR_INVALID_ARGUMENT (not an image, truncated, too large; an engine without a projector),
 * CERA_ERR_OUT_OF_RANGE (it does not fit the context). */
CERA_API cera_status cera_session_append_image(cera_session *session, const uint8_t *data, size_t size);
/* As above from a file; CERA_ERR_IO when it cannot be read. */
CERA_API cera_status cera_session_append_image_file(cera_session *session, const char *path);

/* Evaluates what is queued, then samples until EOS, a stop string, max_tokens, a full context, a
 * cancel or the callback's false. callback may be NULL; result may be NULL. options NULL: the
 * defaults. CERA_ERR_INVALID_ARGUMENT when there is nothing to continue from. A cancel is CERA_OK
 * with finish CERA_FINISH_CANCELLED. */
CERA_API cera_status cera_session_generate(cera_session *session, const cera_generate_options *options,
                                           cera_token_callback callback, void *user_data,
                                           cera_generation_result *result);
/* Stops the generation in progress at the next token boundary (or the next one to start). Any thread. */
CERA_API void cera_session_cancel(cera_session *session);

/* The next-token logits after the last evaluated token: *logits points at n_vocab floats owned by
 * the session, valid until the session changes. Queued tokens are evaluated first. */
CERA_API cera_status cera_session_logits(cera_session *session, const float **logits, int32_t *n_vocab);

typedef enum cera_pooling {
    CERA_POOLING_MEAN = 0, /* the mean over every token: n_embd floats */
    CERA_POOLING_LAST = 1, /* the last token's: n_embd floats */
    CERA_POOLING_NONE = 2, /* every token's: n_tokens * n_embd floats, row-major */
} cera_pooling;

/* Embeddings: resets the session, evaluates the tokens and writes the final-norm hidden states,
 * pooled. Stores the float count in *n_out; buffer convention as above (the work is done again on
 * a second call, so size the buffer from cera_engine_info()->n_embd). */
CERA_API cera_status cera_session_embed(cera_session *session, const cera_token *tokens, size_t n_tokens,
                                        cera_pooling pooling, float *out, size_t capacity, size_t *n_out);

/* Empties the sequence, keeping its memory. */
CERA_API cera_status cera_session_reset(cera_session *session);
/* Keeps the first n tokens (0 <= n <= position). */
CERA_API cera_status cera_session_truncate(cera_session *session, int32_t n);
/* Context shift now: drops half of the evaluated tokens after the first n_keep; *n_dropped (may be
 * NULL) gets the count. */
CERA_API cera_status cera_session_shift_context(cera_session *session, int32_t n_keep, int32_t *n_dropped);
CERA_API int32_t cera_session_position(const cera_session *session);    /* tokens, queued ones included */
CERA_API int32_t cera_session_n_evaluated(const cera_session *session); /* tokens in the KV cache */
CERA_API int32_t cera_session_n_ctx(const cera_session *session);       /* the most tokens it can hold */
/* Every token of the sequence, in order. Buffer convention as above. */
CERA_API cera_status cera_session_tokens(const cera_session *session, cera_token *tokens, size_t capacity,
                                         size_t *n_out);

/* The whole state (tokens, KV cache, recurrent state, last logits) as bytes with a header and
 * checksums: *data is allocated by the library (free it with cera_free()), *size its length. */
CERA_API cera_status cera_session_save_state(const cera_session *session, uint8_t **data, size_t *size);
/* Replaces the state with saved bytes. CERA_ERR_INVALID_FILE (session unchanged) for another
 * model's or KV type's state, or torn or corrupt bytes. */
CERA_API cera_status cera_session_load_state(cera_session *session, const uint8_t *data, size_t size);
/* As above through a file (written atomically). CERA_ERR_IO when it cannot be written or read. */
CERA_API cera_status cera_session_save_state_file(const cera_session *session, const char *path);
CERA_API cera_status cera_session_load_state_file(cera_session *session, const char *path);

/*
 * Sampler: the sampler chain on a row of logits, for loops of one's own
 * (cera_session_logits -> cera_sampler_sample -> cera_session_append_tokens -> ...)
 */

typedef struct cera_sampler cera_sampler;

/* A sampler for n_vocab candidates. CERA_ERR_INVALID_ARGUMENT for NaN or negative values where they
 * make no sense. One thread at a time. */
CERA_API cera_status cera_sampler_new(const cera_sampling_params *params, int32_t n_vocab, cera_sampler **out);
CERA_API void cera_sampler_free(cera_sampler *sampler);
/* The next token for one row of n_vocab logits (not modified); allowed (NULL: all) is a bit mask of
 * the ids in the running (bit id % 64 of allowed[id / 64]). Does not add the token to the penalty
 * window: cera_sampler_accept does. */
CERA_API cera_token cera_sampler_sample(cera_sampler *sampler, const float *logits, const uint64_t *allowed);
/* One candidate of the distribution cera_sampler_sample draws from. */
typedef struct cera_token_prob {
    cera_token token;
    float logit; /* after penalties and temperature */
    float p;     /* normalised over the kept candidates */
} cera_token_prob;
/* The kept candidates with their probabilities, most likely first, exactly as the next
 * cera_sampler_sample on the same logits (and allowed mask, NULL: all) would draw from them (greedy:
 * the single arg-max with p = 1). Stores the count in *n_out; buffer convention as above. */
CERA_API cera_status cera_sampler_distribution(cera_sampler *sampler, const float *logits, const uint64_t *allowed,
                                               cera_token_prob *out, size_t capacity, size_t *n_out);
/* Log-probabilities for reporting (OpenAI's logprobs): the log-softmax over all logits after the logit
 * bias and the penalties, before truncation and temperature. Stores the log-probability of `token` in
 * *logprob and the n_top most likely tokens in top (n_top entries; may be NULL when n_top is 0). Call it
 * before cera_sampler_accept of the token. */
CERA_API cera_status cera_sampler_log_probs(cera_sampler *sampler, const float *logits, cera_token token,
                                            int32_t n_top, cera_token_logprob *top, float *logprob);
/* Adds a token (prompt or generated) to the penalty window. */
CERA_API void cera_sampler_accept(cera_sampler *sampler, cera_token token);
/* Empties the penalty window and re-seeds the generator. */
CERA_API void cera_sampler_reset(cera_sampler *sampler);

/*
 * Batcher: many sequences generated together (continuous batching)
 */

typedef struct cera_batcher_options {
    int32_t parallel;    /* sequences in flight at once */
    int64_t kv_tokens;   /* KV pool size in tokens; 0: `parallel` full contexts */
    int32_t n_ctx;       /* longest sequence; 0: the engine's context */
    int32_t block_size;  /* tokens a KV block (a power of two) */
    int32_t step_tokens; /* tokens a step evaluates, all sequences together */
    int32_t max_queue;   /* requests waiting for a slot; submit refuses more */
} cera_batcher_options;

/* parallel 8, kv_tokens 0, n_ctx 0, block_size 16, step_tokens 512, max_queue 1024. */
CERA_API cera_batcher_options cera_batcher_default_options(void);

typedef struct cera_batcher_stats {
    int64_t steps;
    int64_t tokens_evaluated;
    int64_t preemptions;
    int64_t kv_blocks_total;
    int64_t kv_blocks_free;
    int32_t kv_block_tokens; /* tokens a block */
    int32_t running;
    int32_t waiting;
    uint64_t kv_bytes;       /* the pool: K/V of every block (and short-conv states at block ends) */
} cera_batcher_stats;

/* Starts the batcher's thread and its KV pool on the engine's device. options NULL: the defaults. */
CERA_API cera_status cera_batcher_new(cera_engine *engine, const cera_batcher_options *options, cera_batcher **out);
/* Stops the thread; requests still running finish as cancelled. Requests stay valid handles. */
CERA_API void cera_batcher_free(cera_batcher *batcher);
CERA_API cera_status cera_batcher_stats_get(const cera_batcher *batcher, cera_batcher_stats *out);
/* The longest sequence a request may reach, prompt and generated tokens together. */
CERA_API int32_t cera_batcher_n_ctx(const cera_batcher *batcher);

/* Queues a request: the prompt is evaluated, then tokens are sampled as options say (the device
 * and context-shift settings do not apply). The callback (may be NULL) runs on the batcher's
 * thread. Errors: CERA_ERR_INVALID_ARGUMENT (empty prompt, bad id), CERA_ERR_OUT_OF_RANGE (the
 * prompt cannot fit), CERA_ERR_OVER_CAPACITY (the queue is full). */
CERA_API cera_status cera_batcher_submit(cera_batcher *batcher, const cera_token *prompt, size_t n_prompt,
                                         const cera_generate_options *options, cera_token_callback callback,
                                         void *user_data, cera_request **out);
/* As cera_batcher_submit, with images: the prompt's i-th "<image>" marker (cera_engine_image_marker) is
 * replaced by the tokens of images[i] (encoded by the batcher's engine). Cached prefix blocks are shared
 * only where the images match too. The request holds its own references to the images. Errors as
 * cera_batcher_submit, and CERA_ERR_INVALID_ARGUMENT when the markers and images differ in number (with
 * n_images 0 too: a marker then has no image) or an image comes from another engine. */
CERA_API cera_status cera_batcher_submit_images(cera_batcher *batcher, const cera_token *prompt, size_t n_prompt,
                                                const cera_image *const *images, size_t n_images,
                                                const cera_generate_options *options, cera_token_callback callback,
                                                void *user_data, cera_request **out);
/* Whether the request has finished. */
CERA_API bool cera_request_done(const cera_request *request);
/* Polling, for callers that would rather not be called from the batcher's thread: copies the text
 * the request has generated so far (buffer convention as above; text only grows at its end, so a
 * caller may remember the length it has shown) and sets *done (may be NULL) when the request has
 * finished, in which case the text is all of it. */
CERA_API cera_status cera_request_poll(const cera_request *request, char *buf, size_t capacity, size_t *len_out,
                                       bool *done);
/* Finishes the request (CERA_FINISH_CANCELLED) before its next step. Any thread. */
CERA_API void cera_request_cancel(cera_request *request);
/* Blocks until the request finishes and fills *result (may be NULL); the status is the error that
 * failed the request, if one did. */
CERA_API cera_status cera_request_wait(cera_request *request, cera_generation_result *result);
/* Cancels the request if it still runs, and frees the handle. */
CERA_API void cera_request_free(cera_request *request);

/* ---- perplexity ---- */

/* Perplexity as llama-perplexity measures it: the tokens cut into windows of n_ctx, each from an empty
 * cache (its first token replaced by BOS when the model wants one and bos_per_window), the second half of
 * each scored. With compare_base, the KL statistics against a base file that an earlier run wrote with
 * save_base (the tokens may then be empty: the file holds them). */
typedef struct cera_perplexity_options {
    int32_t n_ctx;             /* window length, >= 4 (default 512) */
    int32_t n_chunks;          /* windows to score at most; < 0: all that fit (default) */
    bool bos_per_window;       /* default true */
    const char *save_base;     /* write the log-probabilities here (a KL base file), or NULL */
    const char *compare_base;  /* compare against this KL base file, or NULL */
    /* After each window: its index (from 0), the windows in all and the running estimate; may be NULL. */
    void (*on_chunk)(int32_t chunk, int32_t n_chunks, double ppl, void *user_data);
    void *user_data;
} cera_perplexity_options;
CERA_API cera_perplexity_options cera_perplexity_default_options(void);

typedef struct cera_perplexity_result {
    int32_t n_ctx;
    int32_t n_chunks;  /* windows scored */
    int64_t n_scored;  /* tokens scored */
    double ppl, ppl_err;
    double seconds;
    bool has_kl;  /* the fields below are set (compare_base was given) */
    double ppl_base;
    double ln_ratio, ln_ratio_err;    /* mean ln(PPL(Q) / PPL(base)) */
    double ppl_ratio, ppl_ratio_err;
    double kld, kld_err;              /* mean KL(base || Q) per token, nats */
    double kld_max, kld_p99, kld_median, kld_min;
    double same_top, same_top_err;    /* fraction of tokens whose arg-max agrees */
    double rms_dp, rms_dp_err;        /* RMS of p_Q(token) - p_base(token) */
} cera_perplexity_result;

/* Runs the windows on a sequence of its own. Errors: CERA_ERR_INVALID_ARGUMENT (bad options, fewer
 * than two windows of tokens), CERA_ERR_IO / CERA_ERR_INVALID_FILE (base files), CERA_ERR_OUT_OF_RANGE
 * (a token id outside the vocabulary). */
CERA_API cera_status cera_perplexity(cera_engine *engine, const cera_token *tokens, size_t n_tokens,
                                     const cera_perplexity_options *options, cera_perplexity_result *out);

#ifdef __cplusplus
}
#endif

#endif /* CERA_H */
