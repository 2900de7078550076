/* src/derive/block_mask.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_block_mask;
