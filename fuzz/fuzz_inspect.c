/* fuzz_inspect.c: the whole `maskpack inspect` analysis on an in-memory file: load (.npy, .npz,
 * .safetensors), classify the members, build each input's layout, cross-check them, build the merged
 * layout, derive every --emit output (encoded as .npz and .safetensors in memory) and write the text
 * and JSON reports into memory. The first byte picks the conventions (what a bare .npy holds, the
 * mask convention, the cu_seqlens form, the position rule, the rule); the rest is the file.
 * Invariants: the exit status is 0, 1 or 2; 0 means a merged layout and no problem; the text report
 * holds no control character but newlines (names from the file are escaped). Memory stays within
 * the 32 MiB budget given to the reader, the per-token analysis and the outputs. */
#include "fuzz_common.h"

#include "cli.h"

static void check_report_text(const char *text, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        FUZZ_ASSERT(c == '\n' || (c >= 0x20 && c != 0x7f), "control byte 0x%02x at %zu of the text report", c, i);
        FUZZ_ASSERT(
            !(c == 0xc2 && i + 1 < len && (unsigned char)text[i + 1] >= 0x80 && (unsigned char)text[i + 1] <= 0x9f),
            "C1 control at %zu of the text report", i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const as[] = {NULL, "attention_mask", "position_ids", "cu_seqlens", "mask4d", NULL, NULL, NULL};
    static const char *const convs[] = {"keep", "doc_id", "masked", "additive"};
    uint8_t sel = data[0];
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)"--mask-convention";
    argv[argc++] = (char *)convs[sel & 3];
    argv[argc++] = (char *)"--cu-form";
    argv[argc++] = (char *)((sel & 4) ? "npu" : "te");
    argv[argc++] = (char *)"--position-rule";
    argv[argc++] = (char *)((sel & 8) ? "step" : "reset");
    if (sel & 16) argv[argc++] = (char *)"--bidirectional";
    if (as[sel >> 5]) {
        argv[argc++] = (char *)"--as";
        argv[argc++] = (char *)as[sel >> 5];
    }
    argv[argc++] = (char *)"--emit=all";
    argv[argc++] = (char *)"--out=unused.npz"; /* required with --emit; replaced by memory below */
    argv[argc++] = (char *)"--max-bytes=33554432";
    cli_options o;
    FUZZ_ASSERT(cli_parse_inspect_options(argc, argv, &o) == 0, "the option parser refused fixed options");
    o.data = data + 1;
    o.data_len = size - 1;
    o.out = NULL; /* outputs encoded in memory */
    o.file = "fuzz-input";

    cli_report r;
    memset(&r, 0, sizeof r);
    int rc = cli_analyze(&o, &r);
    FUZZ_ASSERT(rc == 0 || rc == CLI_EXIT_PROBLEMS || rc == CLI_EXIT_USAGE, "exit status %d", rc);
    if (rc == 0) FUZZ_ASSERT(r.layout && r.n_problems_total == 0, "status 0 without a clean merged layout");
    if (!r.fatal) {
        if (rc == 0 && r.layout && !r.n_problems_total) (void)cli_emit_outputs(&o, &r);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f) {
            cli_print_text(&o, &r, f);
            fclose(f);
            check_report_text(text, len);
            free(text);
        }
        f = open_memstream(&text, &len);
        if (f) {
            o.json = 1;
            (void)cli_print_json(&o, &r, f);
            fclose(f);
            free(text);
        }
    }
    cli_report_free(&r);
    return 0;
}
