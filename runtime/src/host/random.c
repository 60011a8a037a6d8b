/* Host kernels of the random family. */
#include "host/host.h"

void tpu__host_register_random(tpu_host_kernel_fn* table) { (void)table; }
