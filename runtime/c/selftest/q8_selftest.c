/*
 * q8_selftest.c - the int8 kernels (kernels/q8_*.h) on pseudo-random data, plain and fast variants side by
 * side, every input and result paged out for a bit-for-bit comparison with the numpy reference
 * (runtime/python/int8_reference.py), and the instructions each kernel takes, next to the float32 kernels
 * on the same shapes.
 *
 * Built for the host (storage_stdio.c; the fast variants only with -DET_Q8_EMULATE_DSP) and for a
 * Cortex-M4F/M7 under QEMU (storage_semihost.c; fast = SMLAD/SXTB16), by tests/test_c_int8_kernels.py and
 * benchmarks/int8_kernels.py. -DPAGE_DIR="..." selects the page folder; -DQ8_TIMER_BASE=0x40000000u (a CMSDK
 * APB timer) times each kernel: under `qemu-system-arm -icount shift=0` a tick is a fixed number of
 * instructions (the board's instructions_per_tick). Without it the ticks are 0.
 *
 * Pages of case k (k = 0, 1, ...): id (k + 1) * 256 + slot, slots below. Slot 0 is the header, int32:
 * kind, then the kind's parameters (see the header writers); the last page, id 0xFFFF00, is the case count.
 * Exit status: 0 ok; 200 + k: a page-out of case k failed; 1: the page store did not start.
 */
#include <stdint.h>
#include <string.h>

#include "../et_runtime.h"

#ifndef PAGE_DIR
#define PAGE_DIR "."
#endif

enum { KIND_CONV = 1, KIND_LINEAR = 2, KIND_MAXPOOL = 3, KIND_AVGPOOL = 4, KIND_RELU = 5, KIND_RELU6 = 6 };
/* page slots */
enum { S_HEAD = 0, S_X = 1, S_W = 2, S_BIAS = 3, S_MULT = 4, S_SHIFT = 5, S_GY = 6, S_GMULT = 7, S_GSHIFT = 8,
       S_Y = 10, S_Y_FAST = 11, S_GX = 12, S_GX_FAST = 13, S_GW = 14, S_GW_FAST = 15, S_GB = 16, S_GB_FAST = 17,
       S_IDX = 18, S_TICKS = 20 };
/* the ticks page: forward, input gradient, weight gradient; each plain int8, fast int8, float32 */
enum { T_FWD = 0, T_BIN = 3, T_BW = 6, T_COUNT = 9 };

#define MAX_ACT 4096 /* elements of one activation */
#define MAX_W 4096   /* elements of one weight */
#define MAX_C 512    /* channels, and a linear layer's features */

/* -- timing --------------------------------------------------------------------------------------- */
#ifdef Q8_TIMER_BASE
#define TIMER_CTRL (*(volatile uint32_t *)(Q8_TIMER_BASE))
#define TIMER_VALUE (*(volatile uint32_t *)(Q8_TIMER_BASE + 4u))
#define TIMER_RELOAD (*(volatile uint32_t *)(Q8_TIMER_BASE + 8u))
static uint32_t ticks_now(void) { return TIMER_VALUE; }
static void timer_start(void)
{
    TIMER_RELOAD = 0xFFFFFFFFu;
    TIMER_VALUE = 0xFFFFFFFFu;
    TIMER_CTRL = 1u;
}
#else
static uint32_t ticks_now(void) { return 0u; }
static void timer_start(void) {}
#endif

static uint32_t g_ticks[T_COUNT];
static uint32_t g_t0;
#define TIME(slot, call)                              \
    do {                                              \
        g_t0 = ticks_now();                           \
        call;                                         \
        g_ticks[slot] = g_t0 - ticks_now(); /* down */ \
    } while (0)

/* -- data ----------------------------------------------------------------------------------------- */
static uint32_t g_seed = 2024u;

static uint32_t next(void)
{
    g_seed = g_seed * 1664525u + 1013904223u;
    return g_seed >> 8;
}

static int32_t rand_in(int32_t lo, int32_t hi) /* [lo, hi] */
{
    return lo + (int32_t)(next() % (uint32_t)(hi - lo + 1));
}

static void fill8(int8_t *a, int count, int32_t lo, int32_t hi)
{
    int i;
    for (i = 0; i < count; ++i)
        a[i] = (int8_t)rand_in(lo, hi);
}

/* float copies for the float32 kernels' timing: any finite values do */
static void to_float(const int8_t *a, int count, float *f)
{
    int i;
    for (i = 0; i < count; ++i)
        f[i] = (float)a[i] * 0.0078125f;
}

/* per-channel requantisation: multipliers in [2^30, 2^31), exponents around -(base) */
static void fill_requant(int32_t *mult, int32_t *shift, int channels, int base)
{
    int c;
    for (c = 0; c < channels; ++c) {
        mult[c] = (int32_t)(0x40000000u + (next() << 6 & 0x3FFFFFFFu));
        shift[c] = -base + rand_in(-1, 1);
    }
}

static int log2i(long v)
{
    int b = 0;
    while (v > 1) {
        v >>= 1;
        ++b;
    }
    return b;
}

/* -- buffers (static: no heap) -------------------------------------------------------------------- */
static int8_t x8[MAX_ACT], w8[MAX_W], y8[MAX_ACT], y8f[MAX_ACT], gy8[MAX_ACT], gx8[MAX_ACT], gx8f[MAX_ACT];
static int16_t scratch[MAX_W]; /* the fast convolutions' columns and transposed weights */
static int32_t bias[MAX_C], mult[MAX_C], shift[MAX_C], gmult[MAX_C], gshift[MAX_C];
static int32_t gw[MAX_W], gwf[MAX_W], gb[MAX_C], gbf[MAX_C], idx[MAX_ACT];
static float xf[MAX_ACT], wf[MAX_W], yf[MAX_ACT], gyf[MAX_ACT], gxf[MAX_ACT], gwff[MAX_W], gbff[MAX_C];

/* -- paging --------------------------------------------------------------------------------------- */
static int g_case;
static int g_failed;

static void put(int slot, const void *data, long bytes)
{
    if (et_page_out((uint32_t)((g_case + 1) * 256 + slot), data, (uint32_t)bytes) != ET_OK && !g_failed)
        g_failed = 200 + g_case;
}

static void put_ticks(void)
{
    put(S_TICKS, g_ticks, (long)sizeof g_ticks);
    memset(g_ticks, 0, sizeof g_ticks);
}

/* -- cases ---------------------------------------------------------------------------------------- */
static void conv_case(et_conv2d_shape s, int fused_relu)
{
    const int cin_g = s.c_in / s.groups, k = cin_g * s.k_h * s.k_w;
    const long nx = (long)s.n * s.c_in * s.h_in * s.w_in, ny = (long)s.n * s.c_out * s.h_out * s.w_out;
    const long nw = (long)s.c_out * k;
    const int32_t x_zp = rand_in(-100, 100), out_zp = rand_in(-20, 20);
    et_q8_requant q, gq;
    int32_t head[21];

    fill8(x8, (int)nx, -128, 127);
    fill8(w8, (int)nw, -127, 127);
    fill8(gy8, (int)ny, -128, 127);
    {
        int c;
        for (c = 0; c < s.c_out; ++c)
            bias[c] = rand_in(-4096, 4096);
    }
    fill_requant(mult, shift, s.c_out, 9 + log2i(k) / 2);
    fill_requant(gmult, gshift, s.c_in, 9 + log2i((long)s.c_out / s.groups * s.k_h * s.k_w) / 2);
    q.mult = mult;
    q.shift = shift;
    q.out_zp = out_zp;
    q.act_min = fused_relu ? out_zp : -128;
    q.act_max = 127;
    gq.mult = gmult;
    gq.shift = gshift;
    gq.out_zp = 0;
    gq.act_min = -128;
    gq.act_max = 127;

    TIME(T_FWD + 0, et_q8_conv2d_forward_ref(&s, x8, x_zp, w8, bias, &q, y8));
    TIME(T_FWD + 1, et_q8_conv2d_forward(&s, x8, x_zp, w8, bias, &q, scratch, y8f));
    TIME(T_BIN + 0, et_q8_conv2d_backward_input_ref(&s, gy8, w8, &gq, gx8));
    TIME(T_BIN + 1, et_q8_conv2d_backward_input(&s, gy8, w8, &gq, scratch, gx8f));
    TIME(T_BW + 0, et_q8_conv2d_backward_weight_ref(&s, gy8, x8, x_zp, gw, gb));
    TIME(T_BW + 1, et_q8_conv2d_backward_weight(&s, gy8, x8, x_zp, scratch, gwf, gbf));
    to_float(x8, (int)nx, xf);
    to_float(w8, (int)nw, wf);
    to_float(gy8, (int)ny, gyf);
    TIME(T_FWD + 2, et_conv2d_forward(&s, xf, wf, gbff, yf));
    TIME(T_BIN + 2, et_conv2d_backward_input(&s, gyf, wf, gxf));
    TIME(T_BW + 2, et_conv2d_backward_weight(&s, gyf, xf, gwff, gbff));

    memcpy(head, &s, sizeof s); /* 16 ints: n, c_in, h_in, w_in, c_out, h_out, w_out, k_h, k_w, strides, pads, dils, groups */
    head[16] = x_zp;
    head[17] = out_zp;
    head[18] = q.act_min;
    head[19] = q.act_max;
    head[20] = KIND_CONV;
    put(S_HEAD, head, (long)sizeof head);
    put(S_X, x8, nx);
    put(S_W, w8, nw);
    put(S_BIAS, bias, 4L * s.c_out);
    put(S_MULT, mult, 4L * s.c_out);
    put(S_SHIFT, shift, 4L * s.c_out);
    put(S_GY, gy8, ny);
    put(S_GMULT, gmult, 4L * s.c_in);
    put(S_GSHIFT, gshift, 4L * s.c_in);
    put(S_Y, y8, ny);
    put(S_Y_FAST, y8f, ny);
    put(S_GX, gx8, nx);
    put(S_GX_FAST, gx8f, nx);
    put(S_GW, gw, 4 * nw);
    put(S_GW_FAST, gwf, 4 * nw);
    put(S_GB, gb, 4L * s.c_out);
    put(S_GB_FAST, gbf, 4L * s.c_out);
    put_ticks();
    ++g_case;
}

static void linear_case(int n, int in, int out)
{
    const int32_t x_zp = rand_in(-100, 100), out_zp = rand_in(-20, 20);
    et_q8_requant q, gq;
    int32_t head[6];
    int c;

    fill8(x8, n * in, -128, 127);
    fill8(w8, out * in, -127, 127);
    fill8(gy8, n * out, -128, 127);
    for (c = 0; c < out; ++c)
        bias[c] = rand_in(-4096, 4096);
    fill_requant(mult, shift, out, 9 + log2i(in) / 2);
    fill_requant(gmult, gshift, in, 9 + log2i(out) / 2);
    q.mult = mult;
    q.shift = shift;
    q.out_zp = out_zp;
    q.act_min = -128;
    q.act_max = 127;
    gq.mult = gmult;
    gq.shift = gshift;
    gq.out_zp = 0;
    gq.act_min = -128;
    gq.act_max = 127;

    TIME(T_FWD + 0, et_q8_linear_forward_ref(n, in, out, x8, x_zp, w8, bias, &q, y8));
    TIME(T_FWD + 1, et_q8_linear_forward(n, in, out, x8, x_zp, w8, bias, &q, y8f));
    TIME(T_BIN + 0, et_q8_linear_backward_input_ref(n, in, out, gy8, w8, &gq, gx8));
    TIME(T_BIN + 1, et_q8_linear_backward_input(n, in, out, gy8, w8, &gq, gx8f));
    TIME(T_BW + 0, et_q8_linear_backward_weight_ref(n, in, out, gy8, x8, x_zp, gw, gb));
    TIME(T_BW + 1, et_q8_linear_backward_weight(n, in, out, gy8, x8, x_zp, gwf, gbf));
    to_float(x8, n * in, xf);
    to_float(w8, out * in, wf);
    to_float(gy8, n * out, gyf);
    TIME(T_FWD + 2, et_linear_forward(n, in, out, xf, wf, gbff, yf));
    TIME(T_BIN + 2, et_linear_backward_input(n, in, out, gyf, wf, gxf));
    TIME(T_BW + 2, et_linear_backward_weight(n, in, out, gyf, xf, gwff, gbff));

    head[0] = n;
    head[1] = in;
    head[2] = out;
    head[3] = x_zp;
    head[4] = out_zp;
    head[5] = KIND_LINEAR;
    put(S_HEAD, head, (long)sizeof head);
    put(S_X, x8, (long)n * in);
    put(S_W, w8, (long)out * in);
    put(S_BIAS, bias, 4L * out);
    put(S_MULT, mult, 4L * out);
    put(S_SHIFT, shift, 4L * out);
    put(S_GY, gy8, (long)n * out);
    put(S_GMULT, gmult, 4L * in);
    put(S_GSHIFT, gshift, 4L * in);
    put(S_Y, y8, (long)n * out);
    put(S_Y_FAST, y8f, (long)n * out);
    put(S_GX, gx8, (long)n * in);
    put(S_GX_FAST, gx8f, (long)n * in);
    put(S_GW, gw, 4L * out * in);
    put(S_GW_FAST, gwf, 4L * out * in);
    put(S_GB, gb, 4L * out);
    put(S_GB_FAST, gbf, 4L * out);
    put_ticks();
    ++g_case;
}

static void pool_case(int kind, et_pool2d_shape s)
{
    const long nx = (long)s.n * s.c * s.h_in * s.w_in, ny = (long)s.n * s.c * s.h_out * s.w_out;
    const int32_t zp = rand_in(-50, 50);
    int32_t head[17];

    fill8(x8, (int)nx, -128, 127);
    fill8(gy8, (int)ny, -128, 127);
    to_float(x8, (int)nx, xf);
    to_float(gy8, (int)ny, gyf);
    if (kind == KIND_MAXPOOL) {
        TIME(T_FWD + 0, et_q8_maxpool2d_forward(&s, x8, y8, idx));
        TIME(T_BIN + 0, et_q8_maxpool2d_backward(&s, gy8, idx, gx8));
        TIME(T_FWD + 2, et_maxpool2d_forward(&s, xf, yf, idx));
        TIME(T_BIN + 2, et_maxpool2d_backward(&s, gyf, idx, gxf));
        et_q8_maxpool2d_forward(&s, x8, y8, idx); /* the int8 argmax again, for the page */
    } else {
        TIME(T_FWD + 0, et_q8_avgpool2d_forward(&s, x8, zp, y8));
        memset(gx8f, 99, sizeof gx8f); /* the fast backward writes every element, uncovered ones too */
        TIME(T_BIN + 0, et_q8_avgpool2d_backward_ref(&s, gy8, gx8));
        TIME(T_BIN + 1, et_q8_avgpool2d_backward(&s, gy8, gx8f));
        TIME(T_FWD + 2, et_avgpool2d_forward(&s, xf, yf));
        TIME(T_BIN + 2, et_avgpool2d_backward(&s, gyf, gxf));
    }
    memcpy(head, &s, sizeof s); /* 15 ints: n, c, h_in, w_in, h_out, w_out, k, strides, pads, dils, count_include_pad */
    head[15] = zp;
    head[16] = kind;
    put(S_HEAD, head, (long)sizeof head);
    put(S_X, x8, nx);
    put(S_GY, gy8, ny);
    put(S_Y, y8, ny);
    put(S_GX, gx8, nx);
    if (kind == KIND_AVGPOOL)
        put(S_GX_FAST, gx8f, nx);
    if (kind == KIND_MAXPOOL)
        put(S_IDX, idx, 4 * ny);
    put_ticks();
    ++g_case;
}

static void activation_case(int kind, int count)
{
    const int32_t zp = rand_in(-60, 20), q6 = zp + rand_in(20, 100);
    int32_t head[4];

    fill8(x8, count, -128, 127);
    fill8(gy8, count, -128, 127);
    if (kind == KIND_RELU) {
        TIME(T_FWD + 0, et_q8_relu_forward_ref(count, x8, zp, y8));
        TIME(T_FWD + 1, et_q8_relu_forward(count, x8, zp, y8f));
        TIME(T_BIN + 0, et_q8_relu_backward_ref(count, gy8, y8, zp, gx8));
        TIME(T_BIN + 1, et_q8_relu_backward(count, gy8, y8, zp, gx8f));
    } else {
        TIME(T_FWD + 0, et_q8_relu6_forward_ref(count, x8, zp, q6, y8));
        TIME(T_FWD + 1, et_q8_relu6_forward(count, x8, zp, q6, y8f));
        TIME(T_BIN + 0, et_q8_relu6_backward_ref(count, gy8, y8, zp, q6, gx8));
        TIME(T_BIN + 1, et_q8_relu6_backward(count, gy8, y8, zp, q6, gx8f));
    }
    to_float(x8, count, xf);
    to_float(gy8, count, gyf);
    if (kind == KIND_RELU) {
        TIME(T_FWD + 2, et_relu_forward(count, xf, yf));
        TIME(T_BIN + 2, et_relu_backward(count, gyf, yf, gxf));
    } else {
        TIME(T_FWD + 2, et_relu6_forward(count, xf, yf));
        TIME(T_BIN + 2, et_relu6_backward(count, gyf, yf, gxf));
    }
    head[0] = count;
    head[1] = zp;
    head[2] = q6;
    head[3] = kind;
    put(S_HEAD, head, (long)sizeof head);
    put(S_X, x8, count);
    put(S_GY, gy8, count);
    put(S_Y, y8, count);
    put(S_Y_FAST, y8f, count);
    put(S_GX, gx8, count);
    put(S_GX_FAST, gx8f, count);
    put_ticks();
    ++g_case;
}

int main(void)
{
    /* et_conv2d_shape: n, c_in, h_in, w_in, c_out, h_out, w_out, k_h, k_w, stride h/w, pad h/w, dil h/w, groups */
    static const et_conv2d_shape convs[] = {
        /* small shapes that reach every path: groups, leftover channels, strides, dilation, padding */
        {2, 6, 7, 6, 9, 4, 4, 3, 2, 2, 1, 1, 0, 1, 2, 3},
        {1, 4, 5, 5, 8, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 4},   /* depthwise, 2 outputs per channel */
        {1, 10, 3, 5, 7, 3, 5, 1, 1, 1, 1, 0, 0, 1, 1, 1},  /* pointwise, leftovers */
        {1, 3, 9, 9, 5, 9, 9, 3, 3, 1, 1, 2, 2, 2, 2, 1},   /* dilation 2 */
        {2, 8, 6, 7, 12, 6, 7, 1, 1, 1, 1, 0, 0, 1, 1, 2},  /* grouped pointwise, blocks of 4 */
        /* the measured shapes (docs/int8-kernels.md) */
        {1, 16, 16, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1},  /* 3x3 */
        {1, 32, 8, 16, 32, 8, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1},    /* pointwise */
        {1, 64, 8, 8, 64, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 64},     /* depthwise 3x3 */
        {1, 16, 16, 16, 16, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1},    /* 3x3 stride 2 */
    };
    /* et_pool2d_shape: n, c, h_in, w_in, h_out, w_out, k_h, k_w, stride h/w, pad h/w, dil h/w, count_include_pad */
    static const et_pool2d_shape pools[] = {
        {2, 3, 7, 7, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1},
        {1, 2, 9, 8, 3, 4, 3, 2, 2, 2, 0, 0, 2, 1, 0},
        {1, 16, 16, 16, 8, 8, 2, 2, 2, 2, 0, 0, 1, 1, 1}, /* measured */
    };
    static const et_pool2d_shape avgs[] = {
        {2, 3, 7, 7, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1},
        {2, 3, 7, 7, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 0},
        {1, 2, 6, 9, 5, 4, 2, 4, 1, 2, 0, 1, 1, 1, 1},
        {1, 16, 16, 16, 8, 8, 2, 2, 2, 2, 0, 0, 1, 1, 1}, /* measured */
    };
    unsigned i;
    int32_t count;

    if (et_storage_init(PAGE_DIR) != ET_OK)
        return 1;
    timer_start();
    for (i = 0; i < sizeof convs / sizeof convs[0]; ++i)
        conv_case(convs[i], i == 3);
    linear_case(3, 13, 7);
    linear_case(1, 64, 9);
    linear_case(1, 256, 16); /* measured */
    for (i = 0; i < sizeof pools / sizeof pools[0]; ++i)
        pool_case(KIND_MAXPOOL, pools[i]);
    for (i = 0; i < sizeof avgs / sizeof avgs[0]; ++i)
        pool_case(KIND_AVGPOOL, avgs[i]);
    activation_case(KIND_RELU, 37);
    activation_case(KIND_RELU6, 37);
    activation_case(KIND_RELU, 4096);  /* measured */
    activation_case(KIND_RELU6, 4096); /* measured */
    count = g_case;
    if (et_page_out(0xFFFF00u, &count, 4u) != ET_OK)
        return 200 + g_case;
    return g_failed;
}
