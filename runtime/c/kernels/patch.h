/*
 * patch.h - the copies of patch-based execution (a frozen forward prefix computed tile by tile): a region of
 * an NCHW tensor gathered into a dense buffer with zero padding around it (a convolution's halo at the image
 * border), and a tile's output placed into its region of the whole output. Plain copies: bit-identical.
 *
 *   et_patch_gather: src [n][c][src_h][src_w]; rows y .. y+h-1, columns x .. x+w-1 of every plane go to
 *     dst [n][c][top + h + bottom][left + w + right], the border zero.
 *   et_patch_read:   et_patch_gather's copy from the input batch where it lies (storage_input.h), row by row straight
 *     into dst: src is the batch [n][c][src_h][src_w]. ET_OK or the reader's error (dst then unspecified).
 *   et_patch_place:  src [n][c][h][w] goes to rows y .. y+h-1, columns x .. x+w-1 of dst [n][c][dst_h][dst_w].
 */
#ifndef ET_PATCH_H
#define ET_PATCH_H

#include "../storage_input.h"

void et_patch_gather(int n, int c, int src_h, int src_w, const float *src, int y, int h, int x, int w,
                     int top, int bottom, int left, int right, float *dst);
int et_patch_read(const et_input_reader *in, int n, int c, int src_h, int src_w, int y, int h, int x, int w,
                  int top, int bottom, int left, int right, float *dst);
void et_patch_place(int n, int c, int h, int w, const float *src, int dst_h, int dst_w, int y, int x, float *dst);

#endif /* ET_PATCH_H */
