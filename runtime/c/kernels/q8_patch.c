/* q8_patch.c - see q8_patch.h. */
#include <string.h>

#include "q8_convert.h"
#include "q8_patch.h"

void et_q8_patch_gather(int n, int c, int src_h, int src_w, const int8_t *src, int y, int h, int x, int w,
                        int top, int bottom, int left, int right, int32_t pad, int8_t *dst)
{
    int p, r;
    int dh = top + h + bottom, dw = left + w + right;

    for (p = 0; p < n * c; ++p) {
        const int8_t *s = src + (long)p * src_h * src_w;
        int8_t *d = dst + (long)p * dh * dw;
        for (r = 0; r < dh; ++r) {
            int8_t *row = d + r * dw;
            if (r < top || r >= top + h) {
                memset(row, (int8_t)pad, (size_t)dw);
                continue;
            }
            memset(row, (int8_t)pad, (size_t)left);
            memcpy(row + left, s + (long)(y + r - top) * src_w + x, (size_t)w);
            memset(row + left + w, (int8_t)pad, (size_t)right);
        }
    }
}

void et_q8_patch_place(int n, int c, int h, int w, const int8_t *src, int dst_h, int dst_w, int y, int x,
                       int8_t *dst)
{
    int p, r;

    for (p = 0; p < n * c; ++p) {
        const int8_t *s = src + (long)p * h * w;
        int8_t *d = dst + (long)p * dst_h * dst_w;
        for (r = 0; r < h; ++r)
            memcpy(d + (long)(y + r) * dst_w + x, s + (long)r * w, (size_t)w);
    }
}

void et_q8_patch_quantize(int n, int c, int src_h, int src_w, const float *src, int y, int h, int x, int w,
                          float scale, int32_t zp, int8_t *dst)
{
    int p, r;

    for (p = 0; p < n * c; ++p)
        for (r = 0; r < h; ++r)
            et_q8_quantize(w, src + ((long)p * src_h + y + r) * src_w + x, scale, zp, dst + ((long)p * h + r) * w);
}

int et_q8_patch_quantize_read(const et_input_reader *in, int n, int c, int src_h, int src_w, int y, int h, int x,
                              int w, float scale, int32_t zp, int8_t *dst)
{
    float buf[ET_Q8_READ_FLOATS];
    int p, r, k, m, rc;

    for (p = 0; p < n * c; ++p)
        for (r = 0; r < h; ++r)
            for (k = 0; k < w; k += m) {
                m = w - k < ET_Q8_READ_FLOATS ? w - k : ET_Q8_READ_FLOATS;
                rc = et_input_read(in, (uint32_t)(((long)p * src_h + y + r) * src_w + x + k), (uint32_t)m, buf);
                if (rc != ET_OK)
                    return rc;
                et_q8_quantize(m, buf, scale, zp, dst + ((long)p * h + r) * w + k);
            }
    return ET_OK;
}
