/* main.c: the maskpack command-line program: dispatches to its commands. */
#include "cli.h"
#include "plan_cmd.h"

#include <string.h>

static void print_help(FILE *f) {
    fprintf(f,
            "maskpack %s: describe a variable-length batch once, derive every attention input from it\n"
            "\n"
            "usage:\n"
            "  maskpack inspect [FILE] [options]   report a batch's layout and its inconsistencies\n"
            "                                      (without FILE: an embedded sample batch)\n"
            "  maskpack plan LENGTHS --capacity N  pack sequences into rows, balance them across ranks\n"
            "  maskpack cp-sim [options]           context parallelism on paper: per-rank attention work,\n"
            "                                      tokens and ring bytes under zigzag / contiguous / area\n"
            "  maskpack help [COMMAND]             this text, or a command's options\n"
            "  maskpack --version                  print the version\n"
            "\n"
            "'maskpack inspect --help' lists the options of inspect.\n",
            maskpack_version_string());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_help(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0 || strcmp(cmd, "version") == 0) {
        /* the version of the library actually linked */
        printf("maskpack %s\n", maskpack_version_string());
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (argc > 2 && strcmp(argv[2], "inspect") == 0) {
            cli_print_inspect_usage(stdout);
        } else if (argc > 2 && strcmp(argv[2], "plan") == 0) {
            char help_flag[] = "--help";
            char *args[] = {help_flag, NULL};
            return maskpack_cli_plan(1, args);
        } else if (argc > 2) {
            fprintf(stderr, "maskpack: unknown command '%s'\n", argv[2]);
            return CLI_EXIT_USAGE;
        } else
            print_help(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "inspect") == 0) return cli_inspect(argc - 2, argv + 2);
    if (strcmp(cmd, "plan") == 0) return maskpack_cli_plan(argc - 2, argv + 2);
    if (strcmp(cmd, "cp-sim") == 0) return maskpack_cli_cp_sim(argc - 2, argv + 2);
    fprintf(stderr, "maskpack: unknown command '%s' (try 'maskpack help')\n", cmd);
    return CLI_EXIT_USAGE;
}
