/*
 * A C program on cera's C API (include/cera/cera.h): loads a model, continues a prompt and
 * streams the text to stdout; with --chat, answers the prompt as a user message with the
 * model's chat template; with --batch N, generates the prompt N times through the batcher and
 * checks that every copy matches; --lora applies a LoRA adapter (a GGUF LoRA file or a PEFT folder).
 *
 *     cera_c_example MODEL.gguf "Once upon a time" [-n 32] [--temp T] [--seed S] [--chat] [--batch N]
 *                    [--lora PATH]
 *
 * Sampling is greedy unless --temp is given, so the output equals `cera run --temp 0`'s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cera/cera.h"

static bool print_piece(const cera_token_event *event, void *user_data) {
    (void)user_data;
    fwrite(event->text, 1, event->text_len, stdout);
    fflush(stdout);
    return true;
}

static int fail(const char *what, cera_status status) {
    fprintf(stderr, "cera_c_example: %s: %s (%s)\n", what, cera_last_error(), cera_status_name(status));
    return 1;
}

static int run_batch(cera_engine *engine, const char *prompt, const cera_generate_options *g, int n) {
    const cera_tokenizer *tok = cera_engine_tokenizer(engine);
    size_t n_tokens = 0;
    cera_status st = cera_tokenize(tok, prompt, strlen(prompt), true, true, NULL, 0, &n_tokens);
    if (st != CERA_OK && st != CERA_ERR_BUFFER_TOO_SMALL) return fail("tokenize", st);
    cera_token *tokens = malloc(n_tokens * sizeof *tokens);
    if (!tokens) return 1;
    st = cera_tokenize(tok, prompt, strlen(prompt), true, true, tokens, n_tokens, &n_tokens);
    if (st != CERA_OK) return fail("tokenize", st);

    cera_batcher *batcher = NULL;
    cera_batcher_options bo = cera_batcher_default_options();
    bo.parallel = n;
    if ((st = cera_batcher_new(engine, &bo, &batcher)) != CERA_OK) return fail("batcher", st);
    cera_request **requests = calloc((size_t)n, sizeof *requests);
    for (int i = 0; i < n; ++i)
        if ((st = cera_batcher_submit(batcher, tokens, n_tokens, g, NULL, NULL, &requests[i])) != CERA_OK)
            return fail("submit", st);
    char *first = NULL;
    int rc = 0;
    for (int i = 0; i < n; ++i) {
        cera_generation_result r;
        if ((st = cera_request_wait(requests[i], &r)) != CERA_OK) return fail("request", st);
        if (i == 0) {
            first = malloc(r.text_len + 1);
            memcpy(first, r.text, r.text_len + 1);
            fwrite(r.text, 1, r.text_len, stdout);
        } else if (strcmp(first, r.text) != 0) {
            fprintf(stderr, "cera_c_example: request %d differs from request 0\n", i);
            rc = 1;
        }
        cera_request_free(requests[i]);
    }
    free(first);
    free(requests);
    free(tokens);
    cera_batcher_free(batcher);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [-n N] [--temp T] [--seed S] [--chat] [--batch N] [--lora PATH]\n",
                argv[0]);
        return 2;
    }
    const char *model = argv[1], *prompt = argv[2];
    cera_generate_options g = cera_generate_default_options();
    g.max_tokens = 32;
    g.sampling.temperature = 0.0f;
    bool chat = false;
    int batch = 0;
    cera_lora_adapter lora = {NULL, 1.0f};
    for (int i = 3; i < argc; ++i) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) g.max_tokens = atoi(argv[++i]);
        else if (strcmp(argv[i], "--temp") == 0 && i + 1 < argc) g.sampling.temperature = (float)atof(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) g.sampling.seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--chat") == 0) chat = true;
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lora") == 0 && i + 1 < argc) lora.path = argv[++i];
        else {
            fprintf(stderr, "cera_c_example: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (cera_abi_version() != CERA_ABI_VERSION) {
        fprintf(stderr, "cera_c_example: built for ABI %d, the library has %d\n", CERA_ABI_VERSION, cera_abi_version());
        return 1;
    }

    cera_engine_options eo = cera_engine_default_options();
    eo.device = "cpu";
    eo.threads = 1;
    if (lora.path) {
        eo.lora = &lora;
        eo.n_lora = 1;
    }
    cera_engine *engine = NULL;
    cera_status st = cera_engine_load(model, &eo, &engine);
    if (st != CERA_OK) return fail("load", st);
    const cera_model_info *info = cera_engine_info(engine);
    fprintf(stderr, "cera_c_example: cera %s, %s (%s), %d tokens of vocabulary\n", cera_version(), info->architecture,
            info->weight_type, info->n_vocab);

    int rc = 0;
    if (batch > 0) {
        rc = run_batch(engine, prompt, &g, batch);
    } else {
        cera_session *session = NULL;
        if ((st = cera_session_new(engine, 0, &session)) != CERA_OK) return fail("session", st);
        if (chat) {
            const cera_chat_message messages[] = {{"user", prompt}};
            st = cera_session_append_chat(session, messages, 1);
        } else {
            st = cera_session_append_text(session, prompt, true);
        }
        if (st != CERA_OK) return fail("prompt", st);
        cera_generation_result r;
        if ((st = cera_session_generate(session, &g, print_piece, NULL, &r)) != CERA_OK) return fail("generate", st);
        fprintf(stderr, "\ncera_c_example: %d prompt tokens, %d generated, finish: %s\n", r.prompt_tokens,
                r.generated_tokens, cera_finish_reason_name(r.finish));
        cera_session_free(session);
    }
    cera_engine_free(engine);
    return rc;
}
