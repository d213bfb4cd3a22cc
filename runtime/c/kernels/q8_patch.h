/*
 * q8_patch.h - the copies of an int8 prefix computed patch by patch (patch.h's, a byte an element), and the
 * quantisation of a float region into an int8 patch.
 *
 *   et_q8_patch_gather:   src [n][c][src_h][src_w] int8; rows y .. y+h-1, columns x .. x+w-1 of every plane go to
 *     dst [n][c][top + h + bottom][left + w + right], the border `pad` (a convolution's input zero point: a real 0).
 *   et_q8_patch_place:    src [n][c][h][w] goes to rows y .. y+h-1, columns x .. x+w-1 of dst [n][c][dst_h][dst_w].
 *   et_q8_patch_quantize: rows y .. y+h-1, columns x .. x+w-1 of the float src [n][c][src_h][src_w], quantised
 *     as et_q8_quantize does (q8_convert.h: the same calls, a row at a time), to dst [n][c][h][w].
 *   et_q8_patch_quantize_read: the same region read from the input batch where it lies (storage_input.h), up to
 *     ET_Q8_READ_FLOATS floats at a time through a buffer on the stack. ET_OK or the reader's error.
 * Plain copies and the one quantisation: bit-identical to the whole tensors' results.
 */
#ifndef ET_Q8_PATCH_H
#define ET_Q8_PATCH_H

#include <stdint.h>

#include "../storage_input.h"

#define ET_Q8_READ_FLOATS 32 /* et_q8_patch_quantize_read's stack buffer: 128 B */

void et_q8_patch_gather(int n, int c, int src_h, int src_w, const int8_t *src, int y, int h, int x, int w,
                        int top, int bottom, int left, int right, int32_t pad, int8_t *dst);
void et_q8_patch_place(int n, int c, int h, int w, const int8_t *src, int dst_h, int dst_w, int y, int x,
                       int8_t *dst);
void et_q8_patch_quantize(int n, int c, int src_h, int src_w, const float *src, int y, int h, int x, int w,
                          float scale, int32_t zp, int8_t *dst);

int et_q8_patch_quantize_read(const et_input_reader *in, int n, int c, int src_h, int src_w, int y, int h, int x,
                              int w, float scale, int32_t zp, int8_t *dst);

#endif /* ET_Q8_PATCH_H */
