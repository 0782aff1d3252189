/* Greedy continuation of argv[2] by the model argv[1] through the C API, printed to stdout. */
#include <stdio.h>

#include <cera/cera.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    cera_engine_options o = cera_engine_default_options();
    o.device = "cpu";
    o.threads = 1;
    cera_engine *engine = NULL;
    cera_session *session = NULL;
    cera_generation_result r;
    cera_generate_options g = cera_generate_default_options();
    g.max_tokens = 24;
    g.sampling.temperature = 0.0f;
    if (cera_engine_load(argv[1], &o, &engine) != CERA_OK || cera_session_new(engine, 0, &session) != CERA_OK ||
        cera_session_append_text(session, argv[2], true) != CERA_OK ||
        cera_session_generate(session, &g, NULL, NULL, &r) != CERA_OK) {
        fprintf(stderr, "consumer_c: %s\n", cera_last_error());
        return 1;
    }
    fwrite(r.text, 1, r.text_len, stdout);
    cera_session_free(session);
    cera_engine_free(engine);
    return 0;
}
