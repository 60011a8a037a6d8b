/* Host kernels of the linalg family. */
#include "host/host.h"

void tpu__host_register_linalg(tpu_host_kernel_fn* table) { (void)table; }
