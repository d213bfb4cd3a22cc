/*
 * selftest.c - runs every kernel of the runtime on fixed pseudo-random data and pages each result out
 * (then back in, checking the round trip), so that two builds can be compared file by file.
 *
 * tests/test_c_kernels.py builds it twice - for the host with storage_stdio.c and for the Cortex-M4F
 * with storage_semihost.c, run under QEMU - and requires the two page folders to be byte-identical:
 * the same bits from every kernel (exp/log, fmaf, sums) on both, and the same block format.
 *
 * -DPAGE_DIR="..." selects the page folder. -DSELFTEST_READ_PAGE1=1 builds the other mode: page block 1
 * in and exit with the negated status (4 for ET_ERR_CRC), to show a corrupted file is caught on the MCU.
 * Exit status 0: all good; 100 + k: round trip k failed; 200 + k: a page-out failed.
 */
#include <stdint.h>
#include <string.h>

#include "../et_runtime.h"

#ifndef PAGE_DIR
#define PAGE_DIR "."
#endif
#ifndef SELFTEST_READ_PAGE1
#define SELFTEST_READ_PAGE1 0
#endif

/* -- deterministic data: an LCG, 24-bit uniforms converted exactly to float ------------------------ */
static uint32_t g_seed = 12345u;

static float frand(void)
{
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)(g_seed >> 8) / 8388608.0f - 1.0f; /* [-1, 1) */
}

static void fill(float *a, int count, float scale)
{
    int i;
    for (i = 0; i < count; ++i)
        a[i] = frand() * scale;
}

/* -- page out, then back in and compare ---------------------------------------------------------- */
static unsigned char g_check[4096];
static uint32_t g_next_id = 1u;

static int put(const void *data, uint32_t bytes)
{
    const uint32_t id = g_next_id++;
    if (et_page_out(id, data, bytes) != ET_OK)
        return 200 + (int)id;
    if (bytes > sizeof g_check || et_page_in(id, g_check, bytes) != ET_OK || memcmp(g_check, data, bytes) != 0)
        return 100 + (int)id;
    return 0;
}

#define PUT(a)                                          \
    do {                                                \
        int rc_ = put((a), (uint32_t)sizeof(a));        \
        if (rc_ != 0)                                   \
            return rc_;                                 \
    } while (0)

/* -- buffers (static: no heap, no large stack frames) ------------------------------------------- */
/* conv: n 2, c_in 4 -> c_out 6, 9x9, kernel 3x3, stride 2, pad 1, groups 2 -> 5x5 */
static const et_conv2d_shape kConv = {2, 4, 9, 9, 6, 5, 5, 3, 3, 2, 2, 1, 1, 1, 1, 2};
/* depthwise: n 1, 4 channels, 6x6, kernel 3x3, stride 1, pad 1, dilation 1 */
static const et_conv2d_shape kDw = {1, 4, 6, 6, 4, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 4};
static float cx[2 * 4 * 9 * 9], cw[6 * 2 * 3 * 3], cb[6], cy[2 * 6 * 5 * 5], cgy[2 * 6 * 5 * 5];
static float cgx[2 * 4 * 9 * 9], cgw[6 * 2 * 3 * 3], cgb[6], cwbuf[6 * 2 * 3 * 3], cbbuf[6];
static float dx[4 * 6 * 6], dw[4 * 9], dy[4 * 6 * 6], dgx[4 * 6 * 6], dgw[4 * 9];
/* the blocked interiors: n 1, 8 -> 9 channels (two blocks of 4 and one left over), 7x8, 3x3, stride 1, pad 1;
 * and 4 -> 4 channels, 9x9, 3x3, stride 2, pad 1 -> 5x5 */
static const et_conv2d_shape kBlk = {1, 8, 7, 8, 9, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1};
static const et_conv2d_shape kBlk2 = {1, 4, 9, 9, 4, 5, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1};
static float bx[8 * 7 * 8], bw[9 * 8 * 9], bb[9], by[9 * 7 * 8], bgx[8 * 7 * 8], bgw[9 * 8 * 9], bgb[9];
static float b2x[4 * 9 * 9], b2w[4 * 4 * 9], b2y[4 * 5 * 5], b2gx[4 * 9 * 9], b2gw[4 * 4 * 9];
/* pointwise: n 1, 8 -> 8 channels, 5x6, kernel 1x1, pad 1 (padding rows and columns) -> 7x8 */
static const et_conv2d_shape kPw = {1, 8, 5, 6, 8, 7, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1};
static float pwx[8 * 5 * 6], pww[8 * 8], pwb[8], pwy[8 * 7 * 8], pwgx[8 * 5 * 6], pwgw[8 * 8], pwgb[8];

/* pools on a 2 x 3 x 7 x 7 input: max 3x3 stride 2 pad 1 -> 4x4, avg 2x2 stride 2 -> 3x3 */
static const et_pool2d_shape kMax = {2, 3, 7, 7, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 0};
static const et_pool2d_shape kAvg = {2, 3, 7, 7, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1};
static float px[2 * 3 * 7 * 7], pmy[2 * 3 * 4 * 4], pgy[2 * 3 * 4 * 4], pgx[2 * 3 * 7 * 7], pay[2 * 3 * 4 * 4];
static int32_t pidx[2 * 3 * 4 * 4];
static float gap[2 * 3], gapg[2 * 3 * 7 * 7];

/* linear: n 3, 20 -> 10; cross-entropy on its output */
static float lx[3 * 20], lw[10 * 20], lb[10], ly[3 * 10], lgy[3 * 10], lgx[3 * 20], lgw[10 * 20], lgb[10];
static float lwbuf[10 * 20], lbbuf[10];
static int32_t labels[3] = {7, 0, 9};
static float loss[2], one[1], logp[3 * 10], glogp[3 * 10];

/* element-wise */
static float ex[256], ey[256], eg[256], eg2[256], cat[2 * 5 * 4];
static float mx[64], my[64];

/* batch norm: n 2, c 3, 5x5 (double statistics, fused updates); squeeze-excitation scale on the same shape */
static float nx[2 * 3 * 25], ny[2 * 3 * 25], ngy[2 * 3 * 25], ngx[2 * 3 * 25], nw[3], nb[3];
static float nmean[3], ninvstd[3], nvs[3], nrm[3], nrv[3], ngw[3], ngb[3], nwbuf[3], nbbuf[3];
static float ss[2 * 3], sgs[2 * 3];
/* layer norm over the last 25 of [6][25] (the batch-norm buffers reused), weight and bias [25] */
static float lnw[25], lnb[25], lnmean[6], lnrstd[6], lngw[25], lngb[25], lnwbuf[25], lnbbuf[25];

int main(void)
{
    const et_sgd_params opt = {0.05f, 0.9f, 1e-3f};
    int i;

    if (et_storage_init(PAGE_DIR) != ET_OK)
        return 1;
    if (SELFTEST_READ_PAGE1)
        return -et_page_in(1u, cx, (uint32_t)sizeof cx);

    /* conv2d: forward, both gradients, then the fused update (after the input gradient: rule kept). */
    fill(cx, 2 * 4 * 9 * 9, 1.0f);
    fill(cw, 6 * 2 * 3 * 3, 0.3f);
    fill(cb, 6, 0.3f);
    fill(cgy, 2 * 6 * 5 * 5, 1.0f);
    PUT(cx);
    et_conv2d_forward(&kConv, cx, cw, cb, cy);
    PUT(cy);
    et_conv2d_backward_input(&kConv, cgy, cw, cgx);
    PUT(cgx);
    et_conv2d_backward_weight(&kConv, cgy, cx, cgw, cgb);
    PUT(cgw);
    PUT(cgb);
    for (i = 0; i < 3; ++i) /* three fused steps, momentum buffers starting at zero */
        et_conv2d_wgrad_sgd(&kConv, cgy, cx, &opt, cw, cwbuf, cb, cbbuf);
    PUT(cw);
    PUT(cb);
    PUT(cwbuf);

    fill(dx, 4 * 6 * 6, 2.0f);
    fill(dw, 4 * 9, 0.5f);
    et_conv2d_forward(&kDw, dx, dw, NULL, dy);
    PUT(dy);
    et_conv2d_backward_input(&kDw, dy, dw, dgx);
    PUT(dgx);
    et_conv2d_backward_weight(&kDw, dy, dx, dgw, NULL);
    PUT(dgw);

    fill(bx, 8 * 7 * 8, 1.0f);
    fill(bw, 9 * 8 * 9, 0.3f);
    fill(bb, 9, 0.3f);
    et_conv2d_forward(&kBlk, bx, bw, bb, by);
    PUT(by);
    et_conv2d_backward_input(&kBlk, by, bw, bgx);
    PUT(bgx);
    et_conv2d_backward_weight(&kBlk, by, bx, bgw, bgb);
    PUT(bgw);
    PUT(bgb);
    fill(b2x, 4 * 9 * 9, 1.0f);
    fill(b2w, 4 * 4 * 9, 0.3f);
    et_conv2d_forward(&kBlk2, b2x, b2w, NULL, b2y);
    PUT(b2y);
    et_conv2d_backward_input(&kBlk2, b2y, b2w, b2gx);
    PUT(b2gx);
    et_conv2d_backward_weight(&kBlk2, b2y, b2x, b2gw, NULL);
    PUT(b2gw);
    fill(pwx, 8 * 5 * 6, 1.0f);
    fill(pww, 8 * 8, 0.3f);
    fill(pwb, 8, 0.3f);
    et_conv2d_forward(&kPw, pwx, pww, pwb, pwy);
    PUT(pwy);
    et_conv2d_backward_input(&kPw, pwy, pww, pwgx);
    PUT(pwgx);
    et_conv2d_backward_weight(&kPw, pwy, pwx, pwgw, pwgb);
    PUT(pwgw);
    PUT(pwgb);

    /* pooling */
    fill(px, 2 * 3 * 7 * 7, 3.0f);
    fill(pgy, 2 * 3 * 4 * 4, 1.0f);
    et_maxpool2d_forward(&kMax, px, pmy, pidx);
    PUT(pmy);
    PUT(pidx);
    et_maxpool2d_backward(&kMax, pgy, pidx, pgx);
    PUT(pgx);
    et_avgpool2d_forward(&kAvg, px, pay);
    PUT(pay);
    et_avgpool2d_backward(&kAvg, pgy, pgx);
    PUT(pgx);
    et_global_avgpool_forward(2, 3, 49, px, gap);
    PUT(gap);
    et_global_avgpool_backward(2, 3, 49, gap, gapg);
    PUT(gapg);

    /* linear + cross-entropy + fused update */
    fill(lx, 3 * 20, 1.0f);
    fill(lw, 10 * 20, 0.4f);
    fill(lb, 10, 0.2f);
    et_linear_forward(3, 20, 10, lx, lw, lb, ly);
    PUT(ly);
    et_log_softmax_forward(3, 10, ly, logp);
    PUT(logp);
    et_nll_loss_forward(3, 10, logp, labels, -100, &loss[0], &loss[1]);
    PUT(loss);
    one[0] = 1.0f;
    et_nll_loss_backward(3, 10, one, labels, -100, &loss[1], glogp);
    PUT(glogp);
    et_log_softmax_backward(3, 10, glogp, logp, lgy);
    PUT(lgy);
    et_linear_backward_input(3, 20, 10, lgy, lw, lgx);
    PUT(lgx);
    et_linear_backward_weight(3, 20, 10, lgy, lx, lgw, lgb);
    PUT(lgw);
    PUT(lgb);
    for (i = 0; i < 3; ++i)
        et_linear_wgrad_sgd(3, 20, 10, lgy, lx, &opt, lw, lwbuf, lb, lbbuf);
    PUT(lw);
    PUT(lb);

    /* element-wise kernels and the math under them, over a wide range */
    fill(ex, 256, 8.0f);
    fill(eg, 256, 1.0f);
    et_relu_forward(256, ex, ey);
    PUT(ey);
    et_relu_backward(256, eg, ey, eg2);
    PUT(eg2);
    et_relu6_forward(256, ex, ey);
    PUT(ey);
    et_relu6_backward(256, eg, ey, eg2);
    PUT(eg2);
    et_add_forward(256, ex, eg, ey);
    et_add_scalar(256, ey, 0.375f, ey);
    et_sub_forward(256, ey, ex, eg2);
    PUT(eg2);
    et_sum_planes(16, 16, eg2, ey);
    et_fill(16, 1.5f, ey + 16);
    PUT(ey);
    et_sgd_step(&opt, 256, ex, eg, eg2);
    PUT(ex);
    for (i = 0; i < 256; ++i) {
        ey[i] = et_expf(ex[i] * 11.0f);
        eg2[i] = et_logf(ey[i] + 1e-3f);
    }
    PUT(ey);
    PUT(eg2);
    et_concat_forward_part(2, 4, 5, 0, 2, ex, cat);
    et_concat_forward_part(2, 4, 5, 2, 3, eg, cat);
    PUT(cat);
    et_concat_backward_part(2, 4, 5, 2, 3, cat, ey);
    fill(mx, 64, 1.0f);
    et_flatten_copy(64, mx, my);
    PUT(my);

    /* activations with exp (et_expf) and without, forward and backward, over [-8, 8) */
    fill(ex, 256, 8.0f);
    ex[0] = -3.0f; /* the hard activations' boundaries */
    ex[1] = 3.0f;
    et_sigmoid_forward(256, ex, ey);
    PUT(ey);
    et_sigmoid_backward(256, eg, ey, eg2);
    PUT(eg2);
    et_silu_forward(256, ex, ey);
    PUT(ey);
    et_silu_backward(256, eg, ex, eg2);
    PUT(eg2);
    et_hardswish_forward(256, ex, ey);
    et_hardswish_backward(256, eg, ex, eg2);
    PUT(ey);
    PUT(eg2);
    et_hardsigmoid_forward(256, ex, ey);
    et_hardsigmoid_backward(256, eg, ex, eg2);
    PUT(ey);
    PUT(eg2);
    et_gelu_forward(256, ex, 0, ey);
    et_gelu_backward(256, eg, ex, 0, eg2);
    PUT(ey);
    PUT(eg2);
    et_gelu_forward(256, ex, 1, ey);
    et_gelu_backward(256, eg, ex, 1, eg2);
    PUT(ey);
    PUT(eg2);
    et_leaky_relu_forward(256, ex, 0.01f, ey);
    et_leaky_relu_backward(256, eg, ex, 0.01f, eg2);
    PUT(ey);
    PUT(eg2);

    /* batch norm: forward, running statistics, backward, fused update; then the channel-scale multiply */
    fill(nx, 2 * 3 * 25, 2.0f);
    for (i = 0; i < 2 * 3 * 25; ++i)
        nx[i] += 0.5f;
    fill(nw, 3, 1.0f);
    fill(nb, 3, 0.5f);
    fill(ngy, 2 * 3 * 25, 1.0f);
    fill(nrm, 3, 0.1f);
    for (i = 0; i < 3; ++i)
        nrv[i] = 1.0f;
    et_batch_norm_forward(2, 3, 25, nx, nw, nb, 1e-5, ny, nmean, ninvstd, nvs);
    PUT(ny);
    PUT(nmean);
    PUT(ninvstd);
    et_batch_norm_update_running_stats(3, 50, 0.1f, nmean, nvs, nrm, nrv);
    PUT(nrm);
    PUT(nrv);
    et_batch_norm_backward(2, 3, 25, ngy, nx, nw, nmean, ninvstd, ngx, ngw, ngb);
    PUT(ngx);
    PUT(ngw);
    PUT(ngb);
    for (i = 0; i < 3; ++i)
        et_batch_norm_backward_sgd(2, 3, 25, ngy, nx, nmean, ninvstd, &opt, ngx, nw, nwbuf, nb, nbbuf);
    PUT(nw);
    PUT(nb);
    fill(ss, 2 * 3, 1.0f);
    et_mul_bcast_forward(2 * 3, 25, nx, ss, ny);
    PUT(ny);
    et_mul_bcast_backward_scale(2 * 3, 25, ngy, nx, sgs);
    PUT(sgs);
    et_mul_forward(2 * 3 * 25, nx, ngy, ny);
    PUT(ny);
    fill(lnw, 25, 1.0f);
    fill(lnb, 25, 0.5f);
    et_layer_norm_forward(6, 25, nx, lnw, lnb, 1e-5, ny, lnmean, lnrstd);
    PUT(ny);
    PUT(lnmean);
    PUT(lnrstd);
    et_layer_norm_backward(6, 25, ngy, nx, lnmean, lnrstd, lnw, ngx, lngw, lngb);
    PUT(ngx);
    PUT(lngw);
    PUT(lngb);
    et_layer_norm_backward_sgd(6, 25, ngy, nx, lnmean, lnrstd, &opt, ngx, lnw, lnwbuf, lnb, lnbbuf);
    PUT(ngx);
    PUT(lnw);
    PUT(lnb);
    /* dropout: the hashed mask (uint32 multiplies and shifts) at two probabilities, forward and backward */
    et_dropout_forward(256, ex, et_dropout_stream(7u, 3u, 0xDEADBEEFu), 4194304u, 1.33333337f, ey);
    et_dropout_backward(256, eg, et_dropout_stream(7u, 3u, 0xDEADBEEFu), 4194304u, 1.33333337f, eg2);
    PUT(ey);
    PUT(eg2);
    et_dropout_forward(256, ex, et_dropout_stream(0u, 0u, 1u), 8388608u, 2.0f, ey);
    PUT(ey);
    return 0;
}
