/*
 * The elementwise work of one LN-LSTM time step (paper eqs. 20-22; book: Supplement), forward
 * and backward, for float32 on the CPU. Part of lnbook; compiled on first use by
 * lnbook/_native.py with the machine's C compiler and called through ctypes from
 * lnbook.rnn._LNLSTMRecurrence. The matrix products stay in torch (oneDNN); what this file does
 * is everything between two products, in one pass per row instead of a dozen torch operations.
 * Where no compiler is found, the same Function runs the step as torch operations instead, and
 * tests/test_rnn.py checks that both give the same numbers.
 *
 * Per step t, with a = W_hh h_{t-1} (B, 4H) from torch and gi_t = LN(W_ih x_t) + biases:
 *   forward:  zhat_a = (a - mean(a)) / sqrt(var(a) + eps_hh)     (written over a)
 *             z = zhat_a * g_hh + gi_t;  i, f, o = sigmoid(z);  g = tanh(z)
 *             c_t = f c_{t-1} + i g;  zhat_c = LN statistics of c_t;  tc = tanh(zhat_c g_c + b_c)
 *             h_t = o tc
 *   backward: the chain rule through the same lines, with the LN backward
 *             dx = rstd (u - mean(u) - zhat mean(u zhat)), u = dy g.
 * Row statistics and the LN gains' gradients are accumulated in double precision.
 *
 * exp is a Cody-Waite range reduction with a degree-6 polynomial (relative error about 1e-7),
 * written so that the compiler vectorizes it; sigmoid and tanh are built on it.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* "omp simd" lets the compiler reorder these sums into vector lanes (-fopenmp-simd; no OpenMP
   runtime is involved). A compiler that ignores it computes the same sums in order. */
#define PRAGMA(x) _Pragma(#x)
#define SIMD_SUM(...) PRAGMA(omp simd reduction(+:__VA_ARGS__))

/* exp(x) for float32: x = n ln2 + r with |r| <= ln2 / 2, exp(r) = 1 + r + r^2 P(r), times 2^n.
   The input is clamped to [-87, 88] (exp stays a normal, finite float); NaN stays NaN. */
static inline float exp_f32(float x) {
    float xc = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln2) */
    n = (n == n) ? n : 0.0f; /* a NaN input: keep the integer conversion below defined */
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f; /* ln2 split in two parts */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n;
    two_n.i = ((int32_t)n + 127) << 23;
    return (x == x) ? p * two_n.f : x;
}

static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

/* tanh: an odd polynomial for |x| < 0.625, else 1 - 2 / (exp(2|x|) + 1) with x's sign. */
static inline float tanh_f32(float x) {
    float ax = fabsf(x), z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                    + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    float big = copysignf(1.0f - 2.0f / (exp_f32(2.0f * ax) + 1.0f), x);
    return ax < 0.625f ? small : big;
}

typedef struct { float mean, rstd; } stats_t;

/* mean and 1 / sqrt(biased variance + eps) of x[0..n), two passes in double */
static inline stats_t row_stats(const float *restrict x, int64_t n, float eps) {
    double s = 0.0, v = 0.0;
    SIMD_SUM(s)
    for (int64_t j = 0; j < n; j++) s += x[j];
    double m = s / (double)n;
    SIMD_SUM(v)
    for (int64_t j = 0; j < n; j++) {
        double d = (double)x[j] - m;
        v += d * d;
    }
    stats_t st = {(float)m, (float)(1.0 / sqrt(v / (double)n + (double)eps))};
    return st;
}

/* LN backward for one row: dx = rstd (u - mean(u) - zhat mean(u zhat)), u = dy g;
   dg += dy zhat and (if db) db += dy, in double. tmp holds u. */
static void ln_backward_row(int64_t n, const float *restrict dy, const float *restrict zhat,
                            const float *restrict g, float rstd, float *restrict dx,
                            double *restrict dg, double *restrict db, float *restrict tmp) {
    double su = 0.0, suz = 0.0;
    SIMD_SUM(su, suz)
    for (int64_t j = 0; j < n; j++) {
        float u = dy[j] * g[j];
        tmp[j] = u;
        su += u;
        suz += (double)u * zhat[j];
    }
    for (int64_t j = 0; j < n; j++) dg[j] += (double)dy[j] * zhat[j];
    if (db)
        for (int64_t j = 0; j < n; j++) db[j] += dy[j];
    float mu = (float)(su / (double)n), muz = (float)(suz / (double)n);
    for (int64_t j = 0; j < n; j++) dx[j] = rstd * (tmp[j] - mu - zhat[j] * muz);
}

/* Step pieces for one row. GCC trusts `restrict` on parameters, not on local pointers, so each
   loop that writes several arrays sits in a function of its own. */

/* a (4H) -> its LN-normalized value (in place); act = nonlinearities of zhat g + gi */
static void gates_forward(int64_t H, float *restrict a, const float *restrict gi,
                          const float *restrict g, stats_t st, float *restrict act) {
    for (int64_t j = 0; j < 4 * H; j++) {
        float zh = (a[j] - st.mean) * st.rstd;
        a[j] = zh;
        act[j] = zh * g[j] + gi[j];
    }
    for (int64_t j = 0; j < 2 * H; j++) act[j] = sigmoid_f32(act[j]); /* i, f */
    for (int64_t j = 2 * H; j < 3 * H; j++) act[j] = tanh_f32(act[j]); /* g */
    for (int64_t j = 3 * H; j < 4 * H; j++) act[j] = sigmoid_f32(act[j]); /* o */
}

/* eq. 21: c = f c_prev + i g */
static void cell_forward(int64_t H, const float *restrict act, const float *restrict c_prev,
                         float *restrict c) {
    for (int64_t j = 0; j < H; j++) c[j] = act[H + j] * c_prev[j] + act[j] * act[2 * H + j];
}

/* eq. 22: zc = LN-normalized c, tc = tanh(zc g_c + b_c), h = o tc */
static void output_forward(int64_t H, const float *restrict c, stats_t st,
                           const float *restrict g_c, const float *restrict b_c,
                           const float *restrict o, float *restrict zc, float *restrict tc,
                           float *restrict h) {
    for (int64_t j = 0; j < H; j++) {
        float z = (c[j] - st.mean) * st.rstd;
        float th = tanh_f32(z * g_c[j] + b_c[j]);
        zc[j] = z;
        tc[j] = th;
        h[j] = o[j] * th;
    }
}

/* back through h = o tc: dz_o (the o part of dL/dz) and dL/d LN(c) */
static void output_backward(int64_t H, const float *restrict dh, const float *restrict d_out,
                            const float *restrict o, const float *restrict tc,
                            float *restrict dz_o, float *restrict dcn) {
    for (int64_t j = 0; j < H; j++) {
        float d = dh[j] + d_out[j], oj = o[j], th = tc[j];
        dz_o[j] = d * th * oj * (1.0f - oj); /* through o = sigmoid */
        dcn[j] = d * oj * (1.0f - th * th);  /* through tanh */
    }
}

/* back through c = f c_prev + i g: dz for i, f, g; dc becomes dL/dc_prev */
static void cell_backward(int64_t H, const float *restrict act, const float *restrict c_prev,
                          const float *restrict dc_ln, float *restrict dc, float *restrict dz) {
    for (int64_t j = 0; j < H; j++) {
        float d = dc[j] + dc_ln[j];
        float i = act[j], f = act[H + j], g = act[2 * H + j];
        dz[j] = d * g * i * (1.0f - i);
        dz[H + j] = d * c_prev[j] * f * (1.0f - f);
        dz[2 * H + j] = d * i * (1.0f - g * g);
        dc[j] = d * f;
    }
}

/* Everything one layer's time loop needs, laid out as (T, B, ...) contiguous float32 buffers
   (gradients of the LN parameters in float64). Filled once per call by lnbook.rnn. */
typedef struct {
    int64_t B, H;
    float eps_hh, eps_c;
    const float *g_hh, *g_c, *b_c; /* LN gain over 4H; LN gain and bias over H */
    const float *gi;               /* (T, B, 4H) LN(W_ih x) + all biases */
    const float *c0;               /* (B, H) the cell state before step 0 */
    float *act;                    /* (T, B, 4H) i, f, g, o after their nonlinearities */
    float *c, *zc, *tc, *h;        /* (T, B, H) c_t, LN-normalized c_t, tanh(LN(c_t)), h_t */
    float *rs_a, *rs_c;            /* (T, B) 1 / sigma of W_hh h_{t-1} and of c_t */
    const float *d_out;            /* (T, B, H) dL/dh_t from the layer's output */
    float *d_gi, *d_a;             /* (T, B, 4H) dL/d gi_t and dL/d(W_hh h_{t-1}) */
    float *dc;                     /* (B, H) dL/dc_t, carried from step t+1 to step t */
    double *dg_hh, *dg_c, *db_c;   /* (4H), (H), (H) accumulated over steps and rows */
    float *work;                   /* 6H floats of scratch */
} lnlstm_t;

/* Forward of step t. a: (B, 4H) = W_hh h_{t-1}, overwritten with its LN-normalized value. */
void lnlstm_forward_step(const lnlstm_t *s, int64_t t, float *a) {
    const int64_t B = s->B, H = s->H, G = 4 * H;
    const float *c_prev = t > 0 ? s->c + (t - 1) * B * H : s->c0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t r = t * B + b; /* this row in the (T, B, ...) buffers */
        float *act = s->act + r * G, *c = s->c + r * H;
        stats_t st = row_stats(a + b * G, G, s->eps_hh);
        s->rs_a[r] = st.rstd;
        gates_forward(H, a + b * G, s->gi + r * G, s->g_hh, st, act);
        cell_forward(H, act, c_prev + b * H, c);
        st = row_stats(c, H, s->eps_c);
        s->rs_c[r] = st.rstd;
        output_forward(H, c, st, s->g_c, s->b_c, act + 3 * H, s->zc + r * H, s->tc + r * H,
                       s->h + r * H);
    }
}

/* Backward of step t. dh: (B, H) = dL/dh_t through step t+1 (dL/dh_T at the last step);
   d_out[t] is added here. zhat_a: step t's normalized W_hh h_{t-1}. Writes d_gi[t] and d_a[t],
   turns s->dc from dL/dc_t into dL/dc_{t-1}, and accumulates the LN parameters' gradients. */
void lnlstm_backward_step(const lnlstm_t *s, int64_t t, const float *dh, const float *zhat_a) {
    const int64_t B = s->B, H = s->H, G = 4 * H;
    const float *c_prev = t > 0 ? s->c + (t - 1) * B * H : s->c0;
    float *dcn = s->work, *dc_ln = s->work + H, *tmp = s->work + 2 * H;
    for (int64_t b = 0; b < B; b++) {
        const int64_t r = t * B + b;
        const float *act = s->act + r * G;
        float *dz = s->d_gi + r * G;
        output_backward(H, dh + b * H, s->d_out + r * H, act + 3 * H, s->tc + r * H,
                        dz + 3 * H, dcn);
        ln_backward_row(H, dcn, s->zc + r * H, s->g_c, s->rs_c[r], dc_ln, s->dg_c, s->db_c,
                        tmp);
        cell_backward(H, act, c_prev + b * H, dc_ln, s->dc + b * H, dz);
        ln_backward_row(G, dz, zhat_a + b * G, s->g_hh, s->rs_a[r], s->d_a + r * G, s->dg_hh,
                        NULL, tmp);
    }
}

/* The elementwise functions alone, for tests against torch. */
void lnbook_sigmoid_f32(int64_t n, const float *restrict x, float *restrict y) {
    for (int64_t j = 0; j < n; j++) y[j] = sigmoid_f32(x[j]);
}

void lnbook_tanh_f32(int64_t n, const float *restrict x, float *restrict y) {
    for (int64_t j = 0; j < n; j++) y[j] = tanh_f32(x[j]);
}

/* The layout of lnlstm_t as this compiler sees it, checked by the loader against ctypes. */
int64_t lnlstm_struct_size(void) { return (int64_t)sizeof(lnlstm_t); }
