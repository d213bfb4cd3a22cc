/*
 * leaky_relu.h - leaky ReLU, y = x > 0 ? x : x * negative_slope, on `count` contiguous floats.
 *
 *   aten.leaky_relu(self, negative_slope) -> out
 *       et_leaky_relu_forward(count, self, (float)negative_slope, out)
 *   aten.leaky_relu_backward(grad_output, self, negative_slope, self_is_result) -> gx
 *       et_leaky_relu_backward(count, grad_output, self, (float)negative_slope, gx)
 *
 * Backward: gx = s > 0 ? gy : gy * negative_slope, where s is the forward input, or its output when
 * aten's self_is_result is true (in-place leaky_relu_): for negative_slope >= 0 the two have the same
 * sign, so the flag changes nothing here (torch refuses self_is_result with a negative slope).
 * Bit-identical to torch; x <= 0 (including -0.0) and NaN take the slope branch as in torch. In place is
 * allowed.
 */
#ifndef ET_LEAKY_RELU_H
#define ET_LEAKY_RELU_H

void et_leaky_relu_forward(int count, const float *x, float negative_slope, float *y);
void et_leaky_relu_backward(int count, const float *gy, const float *x, float negative_slope, float *gx);

#endif /* ET_LEAKY_RELU_H */
