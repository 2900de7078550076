/* gdn_token_ops.c: the per-token pieces of the Gated DeltaNet layer over a layout besides the conv
 * (conv/conv.c): the q/k L2 norm and the gates beta = sigmoid(b), g = -exp(A_log) softplus(a +
 * dt_bias), each with its backward. Padding rows of every output are 0. */
#include "gdn_common.h"

#include <stdlib.h>
#include <string.h>

/* ---- L2 norm ---------------------------------------------------------------------------------- */

/* Calls fn(token offset views) for every real token: (row, col) of each segment. */
#define GDN_FOR_TOKENS(L, row_, col_, ...)                                                                             \
    for (size_t s_ = 0; s_ < (L)->n_segments; s_++) {                                                                  \
        const maskpack_segment *g_ = &(L)->segs[s_];                                                                   \
        const int64_t row_ = (L)->packed ? 0 : g_->row;                                                                \
        for (int64_t t_ = 0; t_ < g_->q_len; t_++) {                                                                   \
            const int64_t col_ = g_->q_start + t_;                                                                     \
            __VA_ARGS__                                                                                                \
        }                                                                                                              \
    }

static maskpack_status check_eps(double eps, maskpack_error *err) {
    if (!(eps > 0.0) || eps > 1e30)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "eps", -1, -1, "eps: expected a finite number > 0, found %g",
                       eps);
    return MASKPACK_OK;
}

maskpack_status maskpack_gdn_l2norm(const maskpack_layout *layout, const maskpack_tensor *x, double eps,
                                    maskpack_tensor *y, maskpack_error *err) {
    MP_CHECK_NULL(err, layout, "layout");
    MP_CHECK_NULL(err, x, "x");
    MP_CHECK_NULL(err, y, "y");
    gdn_view xv, yv;
    int64_t d[2] = {-1, -1};
    maskpack_status s = mp_token_view_check(layout, x, "x", 2, d, GDN_FLOAT_DTYPES, &xv, err);
    if (s) return s;
    if ((s = mp_token_view_check(layout, y, "y", 2, d, GDN_FLOAT_DTYPES, &yv, err))) return s;
    if ((s = check_eps(eps, err))) return s;
    const maskpack_tensor *ins[1] = {x};
    maskpack_tensor *outs[1] = {y};
    const char *names[1] = {"y"};
    if ((s = gdn_check_overlap(ins, 1, outs, names, 1, err))) return s;
    gdn_zero_pads(layout, &yv, d[0], d[1]);
    const float fe = (float)eps;
    GDN_FOR_TOKENS(layout, row, col, {
        for (int64_t h = 0; h < d[0]; h++) {
            const int64_t xo = row * xv.s_row + col * xv.s_col + h * xv.s_h;
            const int64_t yo = row * yv.s_row + col * yv.s_col + h * yv.s_h;
            float ss = 0.0f;
            for (int64_t i = 0; i < d[1]; i++) {
                const float a = gdn_get(xv.dt, xv.base, xo + i * xv.s_d);
                ss += a * a;
            }
            const float r = 1.0f / sqrtf(ss + fe);
            for (int64_t i = 0; i < d[1]; i++)
                gdn_put(yv.dt, yv.base, yo + i * yv.s_d, gdn_get(xv.dt, xv.base, xo + i * xv.s_d) * r);
        }
    })
    return mp_ok(err);
}

maskpack_status maskpack_gdn_l2norm_backward(const maskpack_layout *layout, const maskpack_tensor *x,
                                             const maskpack_tensor *dy, double eps, maskpack_tensor *dx,
                                             maskpack_error *err) {
    MP_CHECK_NULL(err, layout, "layout");
    MP_CHECK_NULL(err, x, "x");
    MP_CHECK_NULL(err, dy, "dy");
    MP_CHECK_NULL(err, dx, "dx");
    gdn_view xv, dyv, dxv;
    int64_t d[2] = {-1, -1};
    maskpack_status s = mp_token_view_check(layout, x, "x", 2, d, GDN_FLOAT_DTYPES, &xv, err);
    if (s) return s;
    if ((s = mp_token_view_check(layout, dy, "dy", 2, d, GDN_FLOAT_DTYPES, &dyv, err))) return s;
    if ((s = mp_token_view_check(layout, dx, "dx", 2, d, GDN_FLOAT_DTYPES, &dxv, err))) return s;
    if ((s = check_eps(eps, err))) return s;
    const maskpack_tensor *ins[2] = {x, dy};
    maskpack_tensor *outs[1] = {dx};
    const char *names[1] = {"dx"};
    if ((s = gdn_check_overlap(ins, 2, outs, names, 1, err))) return s;
    gdn_zero_pads(layout, &dxv, d[0], d[1]);
    const float fe = (float)eps;
    GDN_FOR_TOKENS(layout, row, col, {
        for (int64_t h = 0; h < d[0]; h++) {
            const int64_t xo = row * xv.s_row + col * xv.s_col + h * xv.s_h;
            const int64_t go = row * dyv.s_row + col * dyv.s_col + h * dyv.s_h;
            const int64_t oo = row * dxv.s_row + col * dxv.s_col + h * dxv.s_h;
            float ss = 0.0f, p = 0.0f;
            for (int64_t i = 0; i < d[1]; i++) {
                const float a = gdn_get(xv.dt, xv.base, xo + i * xv.s_d);
                ss += a * a;
                p += a * gdn_get(dyv.dt, dyv.base, go + i * dyv.s_d);
            }
            /* y = x r: dx = r (dy - y (y . dy)) = r dy - x r^3 (x . dy) */
            const float r = 1.0f / sqrtf(ss + fe), r3p = r * r * r * p;
            for (int64_t i = 0; i < d[1]; i++) {
                const float a = gdn_get(xv.dt, xv.base, xo + i * xv.s_d);
                const float gy = gdn_get(dyv.dt, dyv.base, go + i * dyv.s_d);
                gdn_put(dxv.dt, dxv.base, oo + i * dxv.s_d, r * gy - a * r3p);
            }
        }
    })
    return mp_ok(err);
}

/* ---- gates ---------------------------------------------------------------------------------- */

static maskpack_status head_vec(const maskpack_tensor *t, const char *name, int64_t HV, maskpack_error *err) {
    int64_t sh[1] = {HV};
    maskpack_status s = mp_check_tensor(t, name, 1, 1, err);
    if (s) return s;
    if (!(GDN_FLOAT_DTYPES & MP_DT(t->dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected float32 or bfloat16, found %s", name,
                       maskpack_dtype_name(t->dtype));
    if (t->shape[0] != HV)
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                       "%s: expected shape [%lld] (one per value head), found [%lld]", name, (long long)sh[0],
                       (long long)t->shape[0]);
    return MASKPACK_OK;
}

static inline double softplus_d(double z) { return z > 20.0 ? z : log1p(exp(z)); }

maskpack_status maskpack_gdn_gates(const maskpack_layout *layout, const maskpack_tensor *a, const maskpack_tensor *b,
                                   const maskpack_tensor *A_log, const maskpack_tensor *dt_bias, maskpack_tensor *g,
                                   maskpack_tensor *beta, maskpack_error *err) {
    MP_CHECK_NULL(err, layout, "layout");
    MP_CHECK_NULL(err, a, "a");
    MP_CHECK_NULL(err, b, "b");
    MP_CHECK_NULL(err, A_log, "A_log");
    MP_CHECK_NULL(err, dt_bias, "dt_bias");
    gdn_view av, bv, gv, btv;
    memset(&gv, 0, sizeof gv);
    memset(&btv, 0, sizeof btv);
    int64_t hd[1] = {-1};
    maskpack_status s = mp_token_view_check(layout, a, "a", 1, hd, GDN_FLOAT_DTYPES, &av, err);
    if (s) return s;
    if ((s = mp_token_view_check(layout, b, "b", 1, hd, GDN_FLOAT_DTYPES, &bv, err))) return s;
    if ((s = head_vec(A_log, "A_log", hd[0], err))) return s;
    if ((s = head_vec(dt_bias, "dt_bias", hd[0], err))) return s;
    if (g && (s = mp_token_view_check(layout, g, "g", 1, hd, GDN_FLOAT_DTYPES, &gv, err))) return s;
    if (beta && (s = mp_token_view_check(layout, beta, "beta", 1, hd, GDN_FLOAT_DTYPES, &btv, err))) return s;
    const maskpack_tensor *ins[4] = {a, b, A_log, dt_bias};
    maskpack_tensor *outs[2] = {g, beta};
    const char *names[2] = {"g", "beta"};
    if ((s = gdn_check_overlap(ins, 4, outs, names, 2, err))) return s;
    const int64_t HV = hd[0];
    if (g) gdn_zero_pads(layout, &gv, HV, 1);
    if (beta) gdn_zero_pads(layout, &btv, HV, 1);
    GDN_FOR_TOKENS(layout, row, col, {
        for (int64_t h = 0; h < HV; h++) {
            if (g) {
                const double A = gdn_get(A_log->dtype, A_log->data, h * A_log->strides[0]);
                const double dtb = gdn_get(dt_bias->dtype, dt_bias->data, h * dt_bias->strides[0]);
                const double z = (double)gdn_get(av.dt, av.base, row * av.s_row + col * av.s_col + h * av.s_h) + dtb;
                gdn_put(gv.dt, gv.base, row * gv.s_row + col * gv.s_col + h * gv.s_h, (float)(-exp(A) * softplus_d(z)));
            }
            if (beta) {
                const double x = gdn_get(bv.dt, bv.base, row * bv.s_row + col * bv.s_col + h * bv.s_h);
                gdn_put(btv.dt, btv.base, row * btv.s_row + col * btv.s_col + h * btv.s_h,
                        (float)(1.0 / (1.0 + exp(-x))));
            }
        }
    })
    return mp_ok(err);
}

maskpack_status maskpack_gdn_gates_backward(const maskpack_layout *layout, const maskpack_tensor *a,
                                            const maskpack_tensor *b, const maskpack_tensor *A_log,
                                            const maskpack_tensor *dt_bias, const maskpack_tensor *dg,
                                            const maskpack_tensor *dbeta, maskpack_tensor *da, maskpack_tensor *db,
                                            maskpack_tensor *dA_log, maskpack_tensor *ddt_bias, maskpack_error *err) {
    MP_CHECK_NULL(err, layout, "layout");
    MP_CHECK_NULL(err, a, "a");
    MP_CHECK_NULL(err, b, "b");
    MP_CHECK_NULL(err, A_log, "A_log");
    MP_CHECK_NULL(err, dt_bias, "dt_bias");
    gdn_view av, bv, dgv, dbv, dav, dbo;
    memset(&dgv, 0, sizeof dgv);
    memset(&dbv, 0, sizeof dbv);
    memset(&dav, 0, sizeof dav);
    memset(&dbo, 0, sizeof dbo);
    int64_t hd[1] = {-1};
    maskpack_status s = mp_token_view_check(layout, a, "a", 1, hd, GDN_FLOAT_DTYPES, &av, err);
    if (s) return s;
    if ((s = mp_token_view_check(layout, b, "b", 1, hd, GDN_FLOAT_DTYPES, &bv, err))) return s;
    if ((s = head_vec(A_log, "A_log", hd[0], err))) return s;
    if ((s = head_vec(dt_bias, "dt_bias", hd[0], err))) return s;
    if (dg && (s = mp_token_view_check(layout, dg, "dg", 1, hd, GDN_FLOAT_DTYPES, &dgv, err))) return s;
    if (dbeta && (s = mp_token_view_check(layout, dbeta, "dbeta", 1, hd, GDN_FLOAT_DTYPES, &dbv, err))) return s;
    if (da && (s = mp_token_view_check(layout, da, "da", 1, hd, GDN_FLOAT_DTYPES, &dav, err))) return s;
    if (db && (s = mp_token_view_check(layout, db, "db", 1, hd, GDN_FLOAT_DTYPES, &dbo, err))) return s;
    const int64_t HV = hd[0];
    int64_t sh[1] = {HV};
    if (dA_log && (s = mp_check_output(dA_log, "dA_log", MP_DT(MASKPACK_F32), 1, sh, err))) return s;
    if (ddt_bias && (s = mp_check_output(ddt_bias, "ddt_bias", MP_DT(MASKPACK_F32), 1, sh, err))) return s;
    const maskpack_tensor *ins[6] = {a, b, A_log, dt_bias, dg, dbeta};
    maskpack_tensor *outs[4] = {da, db, dA_log, ddt_bias};
    const char *names[4] = {"da", "db", "dA_log", "ddt_bias"};
    if ((s = gdn_check_overlap(ins, 6, outs, names, 4, err))) return s;
    double *acc = mp_calloc_array((size_t)HV + 1, 2 * sizeof(double)) /* >= 2 * HV + 1 */;
    if (!acc) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "dA_log", -1, -1, "out of memory");
    if (da) gdn_zero_pads(layout, &dav, HV, 1);
    if (db) gdn_zero_pads(layout, &dbo, HV, 1);
    GDN_FOR_TOKENS(layout, row, col, {
        for (int64_t h = 0; h < HV; h++) {
            const double A = exp((double)gdn_get(A_log->dtype, A_log->data, h * A_log->strides[0]));
            const double dtb = gdn_get(dt_bias->dtype, dt_bias->data, h * dt_bias->strides[0]);
            const double z = (double)gdn_get(av.dt, av.base, row * av.s_row + col * av.s_col + h * av.s_h) + dtb;
            const double gg = dg ? gdn_get(dgv.dt, dgv.base, row * dgv.s_row + col * dgv.s_col + h * dgv.s_h) : 0.0;
            /* g = -A softplus(z): dg/dz = -A sigmoid(z) (1 above torch's threshold 20), dg/dA_log = g */
            const double dsp = z > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-z));
            const double dz = gg * -A * dsp;
            acc[h] += gg * (-A * softplus_d(z));
            acc[HV + h] += dz;
            if (da) gdn_put(dav.dt, dav.base, row * dav.s_row + col * dav.s_col + h * dav.s_h, (float)dz);
            if (db) {
                const double gb =
                    dbeta ? gdn_get(dbv.dt, dbv.base, row * dbv.s_row + col * dbv.s_col + h * dbv.s_h) : 0.0;
                const double x = gdn_get(bv.dt, bv.base, row * bv.s_row + col * bv.s_col + h * bv.s_h);
                const double sg = 1.0 / (1.0 + exp(-x));
                gdn_put(dbo.dt, dbo.base, row * dbo.s_row + col * dbo.s_col + h * dbo.s_h,
                        (float)(gb * sg * (1.0 - sg)));
            }
        }
    })
    for (int64_t h = 0; h < HV; h++) {
        if (dA_log) ((float *)dA_log->data)[h * dA_log->strides[0]] = (float)acc[h];
        if (ddt_bias) ((float *)ddt_bias->data)[h * ddt_bias->strides[0]] = (float)acc[HV + h];
    }
    free(acc);
    return mp_ok(err);
}
