/* Host kernels of the nn family. */
#include "host/host.h"

void tpu__host_register_nn(tpu_host_kernel_fn* table) { (void)table; }
