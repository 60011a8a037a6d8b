/* ATen ops of the nn family. */
#include "aten/aten.h"

const tpu_aten_entry_t tpu__aten_nn[] = {
    {NULL, NULL, NULL},
};
