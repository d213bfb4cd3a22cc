/*
 * pool2d.h - the window shape shared by max-pool and avg-pool (NCHW, float32).
 *
 * x [n][c][h_in][w_in] -> y [n][c][h_out][w_out]; output (oh, ow) covers input rows
 * oh*stride_h - pad_h + kh*dil_h for kh in 0..k_h-1 (columns likewise). h_out and w_out are given
 * (the code generator takes them from torch's shape), so ceil_mode is whatever produced them: windows
 * are clipped to the input either way.
 */
#ifndef ET_POOL2D_H
#define ET_POOL2D_H

typedef struct et_pool2d_shape {
    int n, c;
    int h_in, w_in;
    int h_out, w_out;
    int k_h, k_w;
    int stride_h, stride_w;
    int pad_h, pad_w;
    int dil_h, dil_w;           /* max-pool only; avg-pool has no dilation and requires 1 */
    int count_include_pad;      /* avg-pool only: divide by the padded window size (torch's default) */
} et_pool2d_shape;

#endif /* ET_POOL2D_H */
