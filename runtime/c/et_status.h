/*
 * et_status.h - status codes of the edgetrain C runtime.
 *
 * Every function of the runtime that can fail returns one of these (an int, 0 on success, negative on
 * failure) so that generated code can stop a training step at the first error with a single test:
 *     if ((rc = et_page_in(...)) != ET_OK) return rc;
 * Kernels themselves cannot fail: their shapes are checked when the plan is generated (and, in debug
 * builds, by the et_*_shape_check helpers), so they return void.
 */
#ifndef ET_STATUS_H
#define ET_STATUS_H

#define ET_OK             0   /* success */
#define ET_ERR_ARG      (-1)  /* a bad argument: NULL pointer, inconsistent shape, path too long */
#define ET_ERR_IO       (-2)  /* the storage medium failed: open, read, write or close did not complete */
#define ET_ERR_NOT_FOUND (-3) /* page-in of a block that was never paged out (no file / no slot) */
#define ET_ERR_CRC      (-4)  /* page-in read a block whose CRC32 does not match: corrupt data, never used */
#define ET_ERR_FORMAT   (-5)  /* page-in read an intact block of another id or size, or a truncated one */
#define ET_ERR_NOT_INIT (-6)  /* storage used before et_storage_init() */

/* A short constant English name for a status code ("ET_ERR_CRC"), for logs; never NULL. */
const char *et_status_str(int status);

#endif /* ET_STATUS_H */
