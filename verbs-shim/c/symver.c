/* ibv_query_gid_type is exported by libibverbs under a private version node that changes with
 * every rdma-core release (IBVERBS_PRIVATE_25, 33, 34, 57, 59, 64, 65 across releases); programs
 * built against any of them import it by that node. One implementation, one alias per node. */
#include <stdint.h>

int softrdma_query_gid_type(void *context, uint8_t port_num, unsigned int index, unsigned int *type);

#define ALIAS(N)                                                                                   \
    int softrdma_query_gid_type_##N(void *c, uint8_t p, unsigned int i, unsigned int *t)           \
    {                                                                                              \
        return softrdma_query_gid_type(c, p, i, t);                                                \
    }                                                                                              \
    __asm__(".symver softrdma_query_gid_type_" #N ", ibv_query_gid_type@IBVERBS_PRIVATE_" #N);

ALIAS(25)
ALIAS(33)
ALIAS(57)
ALIAS(59)
ALIAS(64)
ALIAS(65)

/* The default node: Debian 12's rdma-core 44. */
int softrdma_query_gid_type_34(void *c, uint8_t p, unsigned int i, unsigned int *t)
{
    return softrdma_query_gid_type(c, p, i, t);
}
__asm__(".symver softrdma_query_gid_type_34, ibv_query_gid_type@@IBVERBS_PRIVATE_34");
