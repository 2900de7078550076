/* test_attention.c: placeholder; fails until its owner lands the real tests. */
#include <stdio.h>
int main(void) { fprintf(stderr, "test_attention: not written yet\n"); return 1; }
