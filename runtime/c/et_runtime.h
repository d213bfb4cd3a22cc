/*
 * et_runtime.h - everything generated firmware needs from the edgetrain C runtime, in one include.
 *
 * Build: compile every .c of runtime/c and runtime/c/kernels except exactly one of storage_stdio.c
 * (host) / storage_semihost.c (QEMU, debug probe) / a board port's storage; C99, float32, no malloc;
 * always with -ffp-contract=off (see README.md). Link with -lm on hosts (fmaf).
 */
#ifndef ET_RUNTIME_H
#define ET_RUNTIME_H

#include "et_status.h"
#include "et_math.h"
#include "crc32.h"
#include "storage.h"
#include "storage_input.h"
#include "kernels/sgd.h"
#include "kernels/conv2d.h"
#include "kernels/conv2d_input_grad.h"
#include "kernels/conv2d_weight_grad.h"
#include "kernels/linear.h"
#include "kernels/relu.h"
#include "kernels/relu6.h"
#include "kernels/pool2d.h"
#include "kernels/maxpool2d.h"
#include "kernels/avgpool2d.h"
#include "kernels/global_avgpool.h"
#include "kernels/add.h"
#include "kernels/concat.h"
#include "kernels/flatten.h"
#include "kernels/log_softmax.h"
#include "kernels/nll_loss.h"
#include "kernels/batch_norm.h"
#include "kernels/sigmoid.h"
#include "kernels/hardsigmoid.h"
#include "kernels/hardswish.h"
#include "kernels/silu.h"
#include "kernels/gelu.h"
#include "kernels/leaky_relu.h"
#include "kernels/mul.h"
#include "kernels/sum.h"
#include "kernels/sub.h"
#include "kernels/div.h"
#include "kernels/fill.h"
#include "kernels/layer_norm.h"
#include "kernels/dropout.h"
#include "kernels/patch.h"
#include "kernels/q8_conv2d.h"
#include "kernels/q8_conv2d_input_grad.h"
#include "kernels/q8_conv2d_weight_grad.h"
#include "kernels/q8_linear.h"
#include "kernels/q8_relu.h"
#include "kernels/q8_relu6.h"
#include "kernels/q8_maxpool2d.h"
#include "kernels/q8_avgpool2d.h"
#include "kernels/q8_convert.h"
#include "kernels/q8_patch.h"
#include "kernels/q8_conv2d_input_grad_sums.h"
#include "kernels/q8_grad_quantize.h"
#include "kernels/q8_grad_rescale.h"
#include "kernels/q8_bias_grad.h"
#include "kernels/q8_qas_sgd.h"

#endif /* ET_RUNTIME_H */
