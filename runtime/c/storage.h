/*
 * storage.h - the page store: where a training step parks activations that do not fit in RAM.
 *
 * The schedule decides which tensors are paged out after their forward and paged back in for the
 * backward; generated code calls
 *     rc = et_page_out(id, arena + OFFSET, BYTES);   ...   rc = et_page_in(id, arena + OFFSET, BYTES);
 * and stops the step on any rc != ET_OK. A page id is any 32-bit number chosen by the code generator
 * (one per paged tensor); paging the same id out again replaces the block.
 *
 * Integrity: every block is stored with a CRC-32 (crc32.h) of its header and payload, recomputed at
 * page-in. A mismatch returns ET_ERR_CRC and the data in `dst` must not be used - the step stops, it
 * never trains on corrupt data. A block of another id or size, or a truncated one, gives ET_ERR_FORMAT.
 *
 * Implementations (link exactly one):
 *   storage_file.c      files, one per id in the directory given to et_storage_init(): the checks, the
 *                       counters, the header and its CRC check, over one raw-I/O back end (et_file_*
 *                       below), linked with it:
 *     storage_stdio.c     through C stdio - the host build and the tests.
 *     storage_semihost.c  through ARM semihosting (QEMU, a debug probe), straight BKPT calls with no
 *                         newlib stdio, hence no heap: the Cortex-M build under QEMU.
 *   a board port        SPI NOR flash, an SD card, external PSRAM ...: see runtime/c/README.md. It only
 *                       has to store and return the bytes of et_block_* below; the CRC check is shared.
 *
 * Block format (the same on every medium; all header fields little-endian):
 *   offset 0  u32 magic 'ETPG' (0x47505445)
 *   offset 4  u32 page id
 *   offset 8  u32 payload bytes
 *   offset 12 u32 CRC-32 of bytes 0..11 followed by the payload
 *   offset 16 payload (the tensor's bytes as they lie in RAM)
 * The CRC covers the header too, so flipping any single byte of a block is reported as ET_ERR_CRC.
 */
#ifndef ET_STORAGE_H
#define ET_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "et_status.h"

#define ET_BLOCK_MAGIC 0x47505445u  /* "ETPG" in little-endian byte order */
#define ET_BLOCK_HEADER_BYTES 16u
/* Longest directory name et_storage_init() accepts (the file name adds ET_BLOCK_NAME_BYTES). */
#define ET_STORAGE_DIR_MAX 200u
#define ET_BLOCK_NAME_BYTES 21u     /* "/et_page_XXXXXXXX.bin" */
/* Room for the longest path et_block_file_name() writes for such a directory, NUL included. */
#define ET_STORAGE_PATH_BYTES (ET_STORAGE_DIR_MAX + ET_BLOCK_NAME_BYTES + 2u)

/* Select where pages go (a directory that exists; "" or "." for the current one). Resets the counters. */
int et_storage_init(const char *dir);

/* Store `bytes` bytes from `src` as block `id`. ET_OK, or ET_ERR_NOT_INIT / ET_ERR_ARG / ET_ERR_IO. */
int et_page_out(uint32_t id, const void *src, uint32_t bytes);

/*
 * Load block `id`, which must hold exactly `bytes` bytes, into `dst` and verify it. ET_OK, or
 * ET_ERR_CRC (corrupt), ET_ERR_FORMAT (other id/size, truncated), ET_ERR_NOT_FOUND (never paged out),
 * ET_ERR_IO, ET_ERR_ARG, ET_ERR_NOT_INIT. On any error the contents of `dst` are unspecified.
 */
int et_page_in(uint32_t id, void *dst, uint32_t bytes);

/* Bytes moved since et_storage_init() (payload only): what the plan reports as paged bytes per step. */
void et_storage_counters(uint32_t *bytes_out, uint32_t *bytes_in);

/* ---- Shared by every implementation (storage_block.c) --------------------------------------------- */

/* Fill the 16-byte header of block `id` whose payload is `payload[0..bytes)`. */
void et_block_header(unsigned char header[ET_BLOCK_HEADER_BYTES], uint32_t id, const void *payload,
                     uint32_t bytes);

/* Verify a header and payload read back for block `id` of `bytes` bytes: ET_OK, ET_ERR_CRC, ET_ERR_FORMAT. */
int et_block_check(const unsigned char header[ET_BLOCK_HEADER_BYTES], uint32_t id, const void *payload,
                   uint32_t bytes);

/*
 * Write "<dir>/et_page_<id as 8 hex digits>.bin" (or just the file name when dir is "") into `out`,
 * which has room for `cap` bytes. ET_OK or ET_ERR_ARG if it does not fit.
 */
int et_block_file_name(char *out, size_t cap, const char *dir, uint32_t id);

/* ---- The raw I/O under storage_file.c (storage_stdio.c or storage_semihost.c) ---------------------- */

/* Create or replace file `path` with `header` followed by `src[0..bytes)`. ET_OK or ET_ERR_IO. */
int et_file_write(const char *path, const unsigned char header[ET_BLOCK_HEADER_BYTES], const void *src,
                  uint32_t bytes);

/*
 * Read file `path`, which must hold exactly ET_BLOCK_HEADER_BYTES + `bytes` bytes, into `header` and
 * `dst[0..bytes)`, unchecked (storage_file.c verifies the CRC). ET_OK, ET_ERR_NOT_FOUND (cannot be
 * opened), ET_ERR_FORMAT (another length), ET_ERR_IO.
 */
int et_file_read(const char *path, unsigned char header[ET_BLOCK_HEADER_BYTES], void *dst, uint32_t bytes);

#endif /* ET_STORAGE_H */
