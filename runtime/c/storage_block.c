/*
 * storage_block.c - the block format of storage.h, shared by every page-store implementation so that a
 * file written by the host build can be read by the QEMU build and vice versa, and so that the CRC check
 * is written once.
 */
#include "storage.h"

#include <string.h>

#include "crc32.h"

static void put_u32le(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v & 0xFFu);
    p[1] = (unsigned char)((v >> 8) & 0xFFu);
    p[2] = (unsigned char)((v >> 16) & 0xFFu);
    p[3] = (unsigned char)((v >> 24) & 0xFFu);
}

static uint32_t get_u32le(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void et_block_header(unsigned char header[ET_BLOCK_HEADER_BYTES], uint32_t id, const void *payload,
                     uint32_t bytes)
{
    uint32_t crc;

    put_u32le(header + 0, ET_BLOCK_MAGIC);
    put_u32le(header + 4, id);
    put_u32le(header + 8, bytes);
    crc = et_crc32_update(0u, header, 12u);
    crc = et_crc32_update(crc, payload, bytes);
    put_u32le(header + 12, crc);
}

int et_block_check(const unsigned char header[ET_BLOCK_HEADER_BYTES], uint32_t id, const void *payload,
                   uint32_t bytes)
{
    uint32_t crc = et_crc32_update(0u, header, 12u);

    crc = et_crc32_update(crc, payload, bytes);
    /* The CRC first: a damaged header must read as corruption, not as "some other block". */
    if (crc != get_u32le(header + 12))
        return ET_ERR_CRC;
    if (get_u32le(header + 0) != ET_BLOCK_MAGIC || get_u32le(header + 4) != id || get_u32le(header + 8) != bytes)
        return ET_ERR_FORMAT;
    return ET_OK;
}

int et_block_file_name(char *out, size_t cap, const char *dir, uint32_t id)
{
    static const char hex[] = "0123456789abcdef";
    const char *prefix = "et_page_";
    size_t dlen, pos, i;

    if (out == NULL || dir == NULL)
        return ET_ERR_ARG;
    dlen = strlen(dir);
    /* dir + '/' + "et_page_" + 8 hex + ".bin" + NUL; written by hand so that no printf is linked in. */
    if (dlen + ET_BLOCK_NAME_BYTES + 1u > cap)
        return ET_ERR_ARG;
    memcpy(out, dir, dlen);
    pos = dlen;
    if (dlen > 0u && dir[dlen - 1u] != '/')
        out[pos++] = '/';
    memcpy(out + pos, prefix, 8u);
    pos += 8u;
    for (i = 0; i < 8u; ++i)
        out[pos++] = hex[(id >> (28u - 4u * i)) & 0xFu];
    memcpy(out + pos, ".bin", 5u); /* with the terminating NUL */
    return ET_OK;
}
