/* The ABI the shim implements: rdma-core's installed public header (libibverbs-dev). */
#include <infiniband/verbs.h>
