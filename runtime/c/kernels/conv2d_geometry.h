/*
 * conv2d_geometry.h - where a convolution window meets the image border: shared by the forward
 * (conv2d.c) and the weight gradient (conv2d_weight_grad.c).
 *
 * Speed comes from splitting the border from the interior. For each output row the range of kernel rows
 * that stay inside the image is computed once (tap_range); columns are split into a left border, an
 * interior where every kernel column is inside, and a right border (interior). The blocked loops then run
 * with no bounds check, `%` or division. Pure index arithmetic: no allocation, no floating point.
 */
#ifndef ET_CONV2D_GEOMETRY_H
#define ET_CONV2D_GEOMETRY_H

/* Taps k in [*lo, *hi) of a window whose tap 0 reads input index `base` (step `dil`, `k` taps) that land
 * inside [0, in). */
static inline void tap_range(int base, int dil, int k, int in, int *lo, int *hi)
{
    int a = 0, b = k;

    if (base < 0)
        a = (-base + dil - 1) / dil;
    if (base + (k - 1) * dil > in - 1)
        b = in - 1 - base < 0 ? 0 : (in - 1 - base) / dil + 1;
    *lo = a;
    *hi = b > a ? b : a;
}

/* Outputs o in [*lo, *hi) (of `out`) whose whole window - input indices o*stride + first .. o*stride + last -
 * lies inside [0, in): the interior. */
static inline void interior(int first, int last, int stride, int in, int out, int *lo, int *hi)
{
    int a = first < 0 ? (-first + stride - 1) / stride : 0;
    int b = in - 1 - last < 0 ? 0 : (in - 1 - last) / stride + 1;

    b = b < out ? b : out;
    *lo = a < b ? a : b;
    *hi = b > *lo ? b : *lo;
}

#endif /* ET_CONV2D_GEOMETRY_H */
