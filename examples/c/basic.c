/* basic.c: the README's C example. Builds a packed layout of three sequences, derives cu_seqlens in
 * both forms, position ids and the Megatron-style dense mask, and shows an error message.
 * Build against an installed maskpack:  cc basic.c $(pkg-config --cflags --libs maskpack) */
#include <maskpack.h>

#include <stdio.h>

int main(void) {
    int64_t lengths[3] = {5, 3, 7};
    maskpack_rule rule = maskpack_rule_default(); /* causal, bottom-right, no window */
    maskpack_layout *layout = NULL;
    maskpack_error err;
    if (maskpack_layout_from_lengths(lengths, 3, MASKPACK_PLACE_PACKED, 0, &rule, &layout, &err) != MASKPACK_OK) {
        fprintf(stderr, "%s: %s\n", maskpack_status_name(err.status), err.message);
        return 1;
    }
    int32_t cu[4], cu_npu[3];
    int64_t n4 = 4, n3 = 3, T = maskpack_layout_q_width(layout);
    maskpack_tensor cu_t = maskpack_tensor_contiguous(cu, MASKPACK_I32, 1, &n4);
    maskpack_tensor npu_t = maskpack_tensor_contiguous(cu_npu, MASKPACK_I32, 1, &n3);
    if (maskpack_cu_seqlens(layout, MASKPACK_CU_TE, 0, &cu_t, &err) ||
        maskpack_cu_seqlens(layout, MASKPACK_CU_NPU, 0, &npu_t, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    printf("cu_seqlens (TE)  = [%d, %d, %d, %d]\n", cu[0], cu[1], cu[2], cu[3]);
    printf("actual_seq_qlen  = [%d, %d, %d]\n", cu_npu[0], cu_npu[1], cu_npu[2]);

    int64_t pos[15];
    maskpack_tensor pos_t = maskpack_tensor_contiguous(pos, MASKPACK_I64, 1, &T);
    maskpack_position_ids(layout, &pos_t, &err);
    printf("position_ids     =");
    for (int64_t t = 0; t < T; t++) printf(" %lld", (long long)pos[t]);
    printf("\n");

    /* the masked-convention (Megatron/TE/Ascend) dense mask [1,1,T,T]: 1 = excluded */
    uint8_t mask[15 * 15];
    int64_t shape[4] = {1, 1, T, T};
    maskpack_tensor m_t = maskpack_tensor_contiguous(mask, MASKPACK_BOOL, 4, shape);
    maskpack_mask4d(layout, MASKPACK_MASK_MASKED, MASKPACK_FILL_NEG_INF, &m_t, &err);
    printf("row 6 of the mask (token 1 of sequence 2) =");
    for (int64_t j = 0; j < T; j++) printf(" %d", mask[6 * T + j]);
    printf("\n");

    /* a wrong output shape is an error naming the argument, expected and found shape */
    int32_t small[3];
    maskpack_tensor bad = maskpack_tensor_contiguous(small, MASKPACK_I32, 1, &n3);
    maskpack_status s = maskpack_cu_seqlens(layout, MASKPACK_CU_TE, 0, &bad, &err);
    printf("%s: %s\n", maskpack_status_name(s), err.message);
    maskpack_layout_free(layout);
    return s == MASKPACK_ERR_SHAPE ? 0 : 1;
}
