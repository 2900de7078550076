/* src/derive/magi.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_magi;
