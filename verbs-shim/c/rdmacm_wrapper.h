/* The librdmacm ABI the shim implements: rdma-core's installed public header (librdmacm-dev). */
#include <rdma/rdma_cma.h>
