/* src/npu/npu_args.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_npu_args;
