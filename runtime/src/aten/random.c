/* ATen ops of the random family. */
#include "aten/aten.h"

const tpu_aten_entry_t tpu__aten_random[] = {
    {NULL, NULL, NULL},
};
