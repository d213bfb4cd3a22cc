/*
 * storage_input.h - the input batch read where it lies (a data file, an SD card, a camera's frame buffer), a
 * region at a time, so that it is never whole in RAM.
 *
 * A plan whose first layers are computed patch by patch (plan.h defines ET_INPUT_IN_STORAGE) reads the batch
 * through a reader: each tile's gather asks for the rows of its patch (halo included) and gets them straight
 * into its patch buffer (kernels/patch.h: et_patch_read). The batch is float32 NCHW; `offset` and `count` are
 * in floats from the batch's first.
 *
 * A driver or board port gives the function that copies floats offset .. offset+count-1 of the current batch
 * into `dst` (returning ET_OK, or ET_ERR_IO when the medium fails) and its context; et_input_memory wraps a
 * batch that is in RAM after all (a test, or a plan called through et_train_step).
 */
#ifndef ET_STORAGE_INPUT_H
#define ET_STORAGE_INPUT_H

#include <stdint.h>

#include "et_status.h"

typedef int (*et_input_read_fn)(void *ctx, uint32_t offset, uint32_t count, float *dst);

typedef struct et_input_reader {
    et_input_read_fn read;
    void *ctx;
} et_input_reader;

/* Floats offset .. offset+count-1 of the batch into dst, counted: ET_OK, ET_ERR_ARG (no reader) or the
 * reader's error. */
int et_input_read(const et_input_reader *in, uint32_t offset, uint32_t count, float *dst);

/* Bytes read through et_input_read since reset (or the last et_input_reset_counter): what the plan reports as
 * input bytes read per step. */
uint32_t et_input_bytes_read(void);
void et_input_reset_counter(void);

/* A reader of a batch that is in RAM at `x`. */
et_input_reader et_input_memory(const float *x);

#endif /* ET_STORAGE_INPUT_H */
