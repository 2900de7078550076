/* test_mask4d.c: placeholder; fails until its owner lands the real tests. */
#include <stdio.h>
int main(void) { fprintf(stderr, "test_mask4d: not written yet\n"); return 1; }
