/*
 * crc32.h - CRC-32 (IEEE 802.3, as zlib, PNG and Ethernet: reflected polynomial 0xEDB88320, initial value
 * and final xor 0xFFFFFFFF). Every paged block carries one; see storage.h.
 */
#ifndef ET_CRC32_H
#define ET_CRC32_H

#include <stdint.h>

/*
 * Continue a CRC over `len` more bytes, zlib-style: start with crc = 0, feed the data in any number of
 * pieces, the result equals zlib.crc32() of the concatenation. (The pre- and post-inversion happen inside,
 * which is what makes the pieces chain.)
 */
uint32_t et_crc32_update(uint32_t crc, const void *data, uint32_t len);

#endif /* ET_CRC32_H */
