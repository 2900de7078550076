/* target_pop.h: closes the target region the file opened (target_avx2.h, attn_avx512_target.h or its
 * own push): functions after it are baseline code again. */
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
