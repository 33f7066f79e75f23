/* Scratch buffers on 64-byte boundaries (included by the kernels' .c files; native.py's build key
 * covers this file). malloc's 16-byte alignment puts half of a row's 32-byte vector loads across two
 * cache lines, each such load costing about two: the 4-bit product of 4 to 8 rows ran 11-18 % slower,
 * and one of 64 rows 12 % (docs/performance.md, stop 47). Free with free(). */
#pragma once

#include <stdlib.h>

static inline void *alloc64(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}
