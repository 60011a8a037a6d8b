/* ATen ops of the index family. */
#include "aten/aten.h"

const tpu_aten_entry_t tpu__aten_index[] = {
    {NULL, NULL, NULL},
};
