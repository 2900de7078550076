/* src/derive/offsets.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_offsets;
