/* main.c: the maskpack command-line program: dispatches to its commands. */
#include "cli.h"
#include "plan_cmd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
            "  maskpack demo [options]             train a small model on a sample batch padded, packed and\n"
            "                                      at cp = 2; one table (Python: torch, transformers)\n"
            "  maskpack help [COMMAND]             this text, or a command's options\n"
            "  maskpack --version                  print the version\n"
            "\n"
            "'maskpack inspect --help' lists the options of inspect.\n",
            maskpack_version_string());
}

/* `maskpack demo`: execs the Python demo (maskpack.demo). The interpreter: MASKPACK_PYTHON, else the
 * .venv/bin/python of the source tree this program was built in (the parent of its directory, when that
 * holds python/maskpack/demo.py), else python3 on the PATH. The source tree's python/ is used when its
 * extension is built there; MASKPACK_CLI tells the demo which program draws its pictures. */
static const char demo_boot[] =
    "import glob, os, sys\n"
    "root = sys.argv.pop(1)\n"
    "if root:\n"
    "    os.environ.setdefault('MASKPACK_ROOT', root)\n"
    "    if glob.glob(os.path.join(root, 'python', 'maskpack', '_maskpack*.so')):\n"
    "        sys.path.insert(0, os.path.join(root, 'python'))\n"
    "try:\n"
    "    import maskpack.demo as demo\n"
    "except ImportError as e:\n"
    "    sys.stderr.write('maskpack demo: %s cannot import the maskpack Python package (%s): run make python '\n"
    "                     '(it installs maskpack, torch and transformers into .venv) or set MASKPACK_PYTHON\\n'\n"
    "                     % (sys.executable, e))\n"
    "    sys.exit(3)\n"
    "sys.argv[0] = 'maskpack demo'\n"
    "sys.exit(demo.main(sys.argv[1:]))\n";

static int cli_demo(int argc, char **argv) {
    char exe[4096], root[4096] = "", venv[4200], probe[4200];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        if (!getenv("MASKPACK_CLI")) setenv("MASKPACK_CLI", exe, 1);
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            slash = strrchr(exe, '/');
            if (slash) {
                *slash = '\0';
                snprintf(probe, sizeof probe, "%s/python/maskpack/demo.py", exe[0] ? exe : "/");
                if (access(probe, R_OK) == 0) snprintf(root, sizeof root, "%s", exe[0] ? exe : "/");
            }
        }
    }
    const char *py = getenv("MASKPACK_PYTHON");
    if (!py || !*py) {
        snprintf(venv, sizeof venv, "%s/.venv/bin/python", root);
        py = (root[0] && access(venv, X_OK) == 0) ? venv : "python3";
    }
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (!args) return CLI_EXIT_PROBLEMS;
    char dash_c[] = "-c";
    args[0] = (char *)py;
    args[1] = dash_c;
    args[2] = (char *)demo_boot;
    args[3] = root;
    for (int i = 0; i < argc; i++) args[4 + i] = argv[i];
    fflush(NULL);
    execvp(py, args);
    fprintf(stderr,
            "maskpack demo: cannot run %s (%s): the demo is Python; set MASKPACK_PYTHON to an interpreter "
            "with maskpack, torch and transformers (make python installs them into .venv)\n",
            py, strerror(errno));
    free(args);
    return CLI_EXIT_PROBLEMS;
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
        } else if (argc > 2 && strcmp(argv[2], "demo") == 0) {
            char help_flag[] = "--help";
            char *args[] = {help_flag, NULL};
            return cli_demo(1, args);
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
    if (strcmp(cmd, "demo") == 0) return cli_demo(argc - 2, argv + 2);
    fprintf(stderr, "maskpack: unknown command '%s' (try 'maskpack help')\n", cmd);
    return CLI_EXIT_USAGE;
}
