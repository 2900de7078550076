/* src/cli/sample_batch.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_sample_batch;
