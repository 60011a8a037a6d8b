/* ATen ops of the linalg family. */
#include "aten/aten.h"

const tpu_aten_entry_t tpu__aten_linalg[] = {
    {NULL, NULL, NULL},
};
