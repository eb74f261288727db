/* rpcbench blocksync: catch-up of a synthetic chain from 1..k peers
 * (services/blocksync), against the link's ceiling. */
#ifndef RPCBENCH_BSBENCH_H
#define RPCBENCH_BSBENCH_H

/* `rpcbench blocksync ...`: argv[1] is "blocksync". Returns the exit code. */
int blocksync_main(int argc, char **argv);

/* `rpcbench feed ...`: the block feed under a generator, N subscribers
 * (feed.c). */
int feed_main(int argc, char **argv);

#endif
