/* ATen ops of the reduce family. */
#include "aten/aten.h"

const tpu_aten_entry_t tpu__aten_reduce[] = {
    {NULL, NULL, NULL},
};
