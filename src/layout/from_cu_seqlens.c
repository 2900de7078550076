/* src/layout/from_cu_seqlens.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_from_cu_seqlens;
