/* Host kernels of the index family. */
#include "host/host.h"

void tpu__host_register_index(tpu_host_kernel_fn* table) { (void)table; }
