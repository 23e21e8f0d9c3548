/* Fused CPU kernel for attnres.depth_attend: the same function and gradients as its PyTorch path.
 *
 * Why it exists: on a CPU, the PyTorch path makes one pass over a (tokens x d_model) tensor per
 * (site, source) pair and op, about ten in forward and backward together, and each pass misses
 * cache. Here each token's sources are read once per call, while they sit in L1, so the cost of
 * depth attention falls to a few passes per source.
 *
 * Built by attnres/cpu_kernel.py with the system C compiler, once per machine, twice: with
 * -DT=float -DSUF=f32 and with -DT=double -DSUF=f64. Threads are OpenMP's, the same runtime
 * and thread count as PyTorch's CPU ops. Layouts (all row-major, contiguous):
 *   keys[k], values[k], outs[s], d_keys[k], d_values[k], prior, d_prior: (N, D)
 *   u, d_u: (nu, S, D), or (nu, N, D) with per_token; source k uses row block (nu > 1 ? k : 0)
 *   rs: (N, n)   dots: (N, n, S)   w: (N, m, S) with m = n + (prior != NULL), prior first
 *   lse: (N, S)  bias, d_bias: (n, S)  ks, vs: (n)  prior_lse, d_prior_lse: (N)
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SUF)

typedef int64_t i64;

/* LANES independent partial sums: one running sum would wait on the adder's latency each step */
#define LANES 32
/* tokens per tile: each source is read as a run of TILE rows, which the prefetcher follows */
#ifndef TILE
#define TILE 32
#endif
static inline T FN(dot)(const T *a, const T *b, i64 D) {
    T acc[LANES] = {0};
    i64 d = 0;
    for (; d + LANES <= D; d += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[d + j] * b[d + j];
    T sum = 0;
    for (; d < D; d++) sum += a[d] * b[d];
    for (int j = 0; j < LANES; j++) sum += acc[j];
    return sum;
}

static inline void FN(axpy)(T *restrict y, T a, const T *restrict x, i64 D) {
#pragma omp simd
    for (i64 d = 0; d < D; d++) y[d] += a * x[d];
}

static inline void FN(scale)(T *restrict y, T a, const T *restrict x, i64 D) {
#pragma omp simd
    for (i64 d = 0; d < D; d++) y[d] = a * x[d];
}

/* Offset of the query row of source k for site s (or token t, per_token) in u, and of its
 * gradient row in d_u (or in a thread's partial sum of d_u). */
static inline i64 FN(qrow)(int nu, int k, int s, i64 t, int S, i64 N, i64 D, int per_token) {
    i64 i = nu > 1 ? k : 0;
    return per_token ? (i * N + t) * D : (i * S + s) * D;
}

int FN(attend_fwd)(i64 N, i64 D, int n, int S, int nu, int per_token, const T *const *keys,
                    const T *const *values, const T *u, const T *rs, const T *bias, const T *ks,
                    const T *vs, const T *prior, const T *prior_lse, T *const *outs, T *lse, T *w,
                    T *dots) {
    const int off = prior != NULL, m = n + off;
    const i64 per = (i64)TILE * m * S; /* logits of a tile's tokens: [token][prior?, sources][site] */
    double *scratch = malloc((size_t)omp_get_max_threads() * per * sizeof(double));
    if (!scratch) return 1;
#pragma omp parallel for schedule(static)
    for (i64 t0 = 0; t0 < N; t0 += TILE) {
        const i64 t1 = t0 + TILE < N ? t0 + TILE : N;
        double *lg = scratch + omp_get_thread_num() * per;
        for (int k = 0; k < n; k++)
            for (i64 t = t0; t < t1; t++)
                for (int s = 0; s < S; s++) {
                    T dt = FN(dot)(keys[k] + t * D, u + FN(qrow)(nu, k, s, t, S, N, D, per_token), D);
                    if (ks) dt *= ks[k];
                    dots[(t * n + k) * S + s] = dt;
                    lg[((t - t0) * m + off + k) * S + s] = (double)dt * rs[t * n + k] + (bias ? bias[k * S + s] : 0.0);
                }
        for (i64 t = t0; t < t1; t++)
            for (int s = 0; s < S; s++) {
                double *l = lg + (t - t0) * m * S + s;
                if (off) l[0] = prior_lse[t];
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < m; j++) mx = l[j * S] > mx ? l[j * S] : mx;
                for (int j = 0; j < m; j++) sum += exp(l[j * S] - mx);
                const double z = mx + log(sum);
                lse[t * S + s] = (T)z;
                for (int j = 0; j < m; j++) w[(t * m + j) * S + s] = (T)exp(l[j * S] - z);
            }
        for (int s = 0; s < S; s++) {
            for (i64 t = t0; t < t1; t++) {
                const T w0 = w[t * m * S + s];
                if (off) FN(scale)(outs[s] + t * D, w0, prior + t * D, D);
                else FN(scale)(outs[s] + t * D, w0 * (vs ? vs[0] : 1), values[0] + t * D, D);
            }
            for (int k = 1 - off; k < n; k++)
                for (i64 t = t0; t < t1; t++)
                    FN(axpy)(outs[s] + t * D, w[(t * m + off + k) * S + s] * (vs ? vs[k] : 1), values[k] + t * D, D);
        }
    }
    free(scratch);
    return 0;
}

/* Gradients. d_u and d_bias are accumulated (the caller zeroes them); every other output is
 * overwritten. g_out[s] may be NULL (no gradient reached that output), and so may g_lse.
 * With has_values == 0, d_values is unused and the value gradient goes into d_keys. */
int FN(attend_bwd)(i64 N, i64 D, int n, int S, int nu, int per_token, int has_values,
                    const T *const *keys, const T *const *values, const T *u, const T *rs,
                    const T *ks, const T *vs, const T *w, const T *dots, int off,
                    const T *const *outs, const T *const *g_out, const T *g_lse, T *const *d_keys,
                    T *const *d_values, T *d_u, T *d_bias, T *d_prior, T *d_prior_lse) {
    const int m = n + off;
    const i64 usz = per_token ? 0 : (i64)nu * S * D;
    const int nth = omp_get_max_threads();
    /* per-thread partial sums of the reductions over tokens, added in thread order afterwards,
     * so results do not depend on which thread finishes first */
    T *uacc = usz ? calloc((size_t)nth * usz, sizeof(T)) : NULL;
    double *bacc = d_bias ? calloc((size_t)nth * n * S, sizeof(double)) : NULL;
    /* per tile token: value . gradient, d logit, and out . gradient (total) / the sources' share */
    const i64 per = 2 * (i64)TILE * n * S + 2 * (i64)TILE * S;
    double *scratch = malloc((size_t)nth * per * sizeof(double));
    if (!scratch || (usz && !uacc) || (d_bias && !bacc)) {
        free(uacc);
        free(bacc);
        free(scratch);
        return 1;
    }
#pragma omp parallel
    {
        const int th = omp_get_thread_num();
        T *myu = uacc ? uacc + th * usz : NULL;
        double *myb = bacc ? bacc + (i64)th * n * S : NULL;
        double *gv = scratch + th * per, *dl = gv + TILE * n * S, *tot = dl + TILE * n * S, *part = tot + TILE * S;
#pragma omp for schedule(static)
        for (i64 t0 = 0; t0 < N; t0 += TILE) {
            const i64 t1 = t0 + TILE < N ? t0 + TILE : N;
            for (int k = 0; k < n; k++)
                for (i64 t = t0; t < t1; t++)
                    for (int s = 0; s < S; s++)
                        gv[((t - t0) * n + k) * S + s] =
                            g_out[s] ? (double)FN(dot)(values[k] + t * D, g_out[s] + t * D, D) * (vs ? vs[k] : 1) : 0.0;
            for (i64 t = t0; t < t1; t++) {
                const T *wt = w + t * m * S;
                const i64 b = (t - t0) * n * S;
                for (int s = 0; s < S; s++) {
                    double p = 0.0;
                    for (int k = 0; k < n; k++) p += wt[(off + k) * S + s] * gv[b + k * S + s];
                    part[(t - t0) * S + s] = p;
                    tot[(t - t0) * S + s] =
                        off ? (g_out[s] ? (double)FN(dot)(outs[s] + t * D, g_out[s] + t * D, D) : 0.0) : p;
                }
                for (int k = 0; k < n; k++)
                    for (int s = 0; s < S; s++) {
                        const double wk = wt[(off + k) * S + s];
                        dl[b + k * S + s] = wk * (gv[b + k * S + s] - tot[(t - t0) * S + s]) + (g_lse ? wk * g_lse[t * S + s] : 0.0);
                        if (myb) myb[k * S + s] += dl[b + k * S + s];
                    }
                if (off) {
                    double dpl = 0.0;
                    T *dp = d_prior + t * D;
                    memset(dp, 0, D * sizeof(T));
                    for (int s = 0; s < S; s++) {
                        const double w0 = wt[s], tt = tot[(t - t0) * S + s];
                        dpl += tt - part[(t - t0) * S + s] - w0 * tt + (g_lse ? w0 * g_lse[t * S + s] : 0.0);
                        if (g_out[s]) FN(axpy)(dp, (T)w0, g_out[s] + t * D, D);
                    }
                    d_prior_lse[t] = (T)dpl;
                }
            }
            for (int k = 0; k < n; k++) {
                const double c = ks ? ks[k] : 1.0;
                for (i64 t = t0; t < t1; t++) {
                    const T *K = keys[k] + t * D, *wt = w + t * m * S;
                    const double *dlt = dl + ((t - t0) * n + k) * S, r = rs[t * n + k];
                    double coef = 0.0;
                    for (int s = 0; s < S; s++) coef -= dlt[s] * dots[(t * n + k) * S + s];
                    coef *= r * r * r / (double)D * c * c;
                    T *dv = (has_values ? d_values[k] : d_keys[k]) + t * D;
                    memset(dv, 0, D * sizeof(T));
                    for (int s = 0; s < S; s++)
                        if (g_out[s]) FN(axpy)(dv, wt[(off + k) * S + s] * (vs ? vs[k] : 1), g_out[s] + t * D, D);
                    T *dk = d_keys[k] + t * D;
                    if (has_values) FN(scale)(dk, (T)coef, K, D);
                    else FN(axpy)(dk, (T)coef, K, D);
                    for (int s = 0; s < S; s++) {
                        const T alpha = (T)(dlt[s] * r * c);
                        const i64 q = FN(qrow)(nu, k, s, t, S, N, D, per_token);
                        FN(axpy)(dk, alpha, u + q, D);
                        FN(axpy)((per_token ? d_u : myu) + q, alpha, K, D);
                    }
                }
            }
        }
    }
    for (int th = 0; th < nth; th++) {
        if (uacc) FN(axpy)(d_u, 1, uacc + th * usz, usz);
        if (bacc)
            for (int j = 0; j < n * S; j++) d_bias[j] += (T)bacc[(i64)th * n * S + j];
    }
    free(uacc);
    free(bacc);
    free(scratch);
    return 0;
}
