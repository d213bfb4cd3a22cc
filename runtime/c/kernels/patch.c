/* patch.c - see patch.h. */
#include "patch.h"

void et_patch_gather(int n, int c, int src_h, int src_w, const float *src, int y, int h, int x, int w,
                     int top, int bottom, int left, int right, float *dst)
{
    int p, r, k;
    int dh = top + h + bottom, dw = left + w + right;

    for (p = 0; p < n * c; ++p) {
        const float *s = src + (long)p * src_h * src_w;
        float *d = dst + (long)p * dh * dw;
        for (r = 0; r < dh; ++r) {
            int sy = y + r - top;
            for (k = 0; k < dw; ++k) {
                int sx = x + k - left;
                d[r * dw + k] = (r < top || r >= top + h || k < left || k >= left + w) ? 0.0f : s[sy * src_w + sx];
            }
        }
    }
}

int et_patch_read(const et_input_reader *in, int n, int c, int src_h, int src_w, int y, int h, int x, int w,
                  int top, int bottom, int left, int right, float *dst)
{
    int p, r, k, rc;
    int dh = top + h + bottom, dw = left + w + right;

    for (p = 0; p < n * c; ++p) {
        float *d = dst + (long)p * dh * dw;
        for (r = 0; r < dh; ++r) {
            float *row = d + r * dw;
            if (r < top || r >= top + h) {
                for (k = 0; k < dw; ++k)
                    row[k] = 0.0f;
                continue;
            }
            for (k = 0; k < left; ++k)
                row[k] = 0.0f;
            for (k = left + w; k < dw; ++k)
                row[k] = 0.0f;
            rc = et_input_read(in, (uint32_t)(((long)p * src_h + y + r - top) * src_w + x), (uint32_t)w, row + left);
            if (rc != ET_OK)
                return rc;
        }
    }
    return ET_OK;
}

void et_patch_place(int n, int c, int h, int w, const float *src, int dst_h, int dst_w, int y, int x, float *dst)
{
    int p, r, k;

    for (p = 0; p < n * c; ++p) {
        const float *s = src + (long)p * h * w;
        float *d = dst + (long)p * dst_h * dst_w;
        for (r = 0; r < h; ++r)
            for (k = 0; k < w; ++k)
                d[(y + r) * dst_w + x + k] = s[r * w + k];
    }
}
