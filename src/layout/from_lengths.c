/* src/layout/from_lengths.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_from_lengths;
