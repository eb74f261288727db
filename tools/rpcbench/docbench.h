/* rpcbench doc: YCSB-style benchmark of the document service
 * (services/doc). */
#ifndef RPCBENCH_DOCBENCH_H
#define RPCBENCH_DOCBENCH_H

/* `rpcbench doc ...`: argv[1] is "doc". Returns the exit code. */
int doc_main(int argc, char **argv);

#endif
