/* src/layout/from_position_ids.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_from_position_ids;
