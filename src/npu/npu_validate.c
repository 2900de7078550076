/* src/npu/npu_validate.c: placeholder until its owner lands it. */
typedef int maskpack_placeholder_npu_validate;
