/*
 * crc32.c - CRC-32/IEEE with a 16-entry table (64 bytes of flash), four bits at a time.
 *
 * A full 256-entry table is 1 KB of flash for ~2x the speed; paging is bounded by the storage medium
 * (SPI flash, SD, semihosting), not by this loop, so the small table is the better trade on a MCU.
 */
#include "crc32.h"

/* kNibble[i] = CRC of the 4-bit value i shifted through the reflected polynomial 0xEDB88320. */
static const uint32_t kNibble[16] = {
    0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u, 0x4DB26158u, 0x5005713Cu,
    0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu, 0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu,
};

uint32_t et_crc32_update(uint32_t crc, const void *data, uint32_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    uint32_t i;

    crc = ~crc;
    for (i = 0; i < len; ++i) {
        crc ^= (uint32_t)p[i];
        crc = (crc >> 4) ^ kNibble[crc & 0x0Fu]; /* low nibble first: the CRC is bit-reflected */
        crc = (crc >> 4) ^ kNibble[crc & 0x0Fu];
    }
    return ~crc;
}
