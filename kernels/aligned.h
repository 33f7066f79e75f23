/* Scratch buffers on 64-byte boundaries (included by the kernels' .c files; native.py's build key
 * covers this file). malloc's 16-byte alignment puts half of a row's 32-byte vector loads across two
 * cache lines, each such load costing about two: the 4-bit product of 5 to 8 rows ran 8-11 % slower,
 * and a prefill's 5-17 % (docs/performance.md, stop 47). Free with free(). */
#pragma once

#include <stdlib.h>

static inline void *alloc64(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}
