/* plan_cmd.h: the `maskpack plan` command (packing planner front end). */
#ifndef MASKPACK_CLI_PLAN_CMD_H
#define MASKPACK_CLI_PLAN_CMD_H

#include "maskpack.h"

#include <stddef.h>
#include <stdint.h>

/* (argc, argv after "plan") -> exit status: 0 ok, 1 input or output problem, 2 bad usage. */
int maskpack_cli_plan(int argc, char **argv);

/* (name for messages, bytes of a lengths file: text, JSON lines or .npy) -> *lengths (malloc'd, caller
 * frees), *n, *kind ("text", "jsonl", "npy"): what `maskpack plan` reads, from memory (the fuzz
 * target's entry). Returns 0, or 1 after printing the problem to stderr. */
int mp_cli_plan_parse_lengths(const char *origin, const uint8_t *buf, size_t len, int64_t **lengths, size_t *n,
                              const char **kind);

/* (path, plan, source and objective named in the caption) -> writes the plan's picture (plan_png.c): PNG,
 * or SVG when path ends in .svg. Rows of each rank stacked top to bottom, coloured by sequence
 * (alignment filler lighter, unused columns grey), ranks and micro-batches named, a token axis, the
 * capacity line, each rank's cost beside its rows with the mean line, a legend, and the fill and
 * imbalance in the caption. At most `max_rows` rows per rank are drawn (0 = automatic); *drawn_rows
 * receives the rows drawn per rank. Without cairo: MASKPACK_ERR_UNSUPPORTED saying pictures were not
 * built in. */
maskpack_status mp_cli_plan_png(const char *path, const maskpack_plan *plan, const char *source, const char *objective,
                                int64_t max_rows, int64_t *drawn_rows, maskpack_error *err);

#endif
