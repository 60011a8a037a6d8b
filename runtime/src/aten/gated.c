/* ATen gated activations and recurrent cells: glu, prelu, the fused LSTM and GRU cells,
 * forward and backward. */
#include "aten/aten.h"

const tpu_aten_entry_t tpu__aten_gated[] = {
    {NULL, NULL, NULL},
};
