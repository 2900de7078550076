/* src/layout/from_mask2d.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_from_mask2d;
