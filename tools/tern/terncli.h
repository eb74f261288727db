/* tern's subcommands beside `tern pool`. */
#ifndef TERN_CLI_H
#define TERN_CLI_H

/* `tern doc PATH` or `tern doc --uri URI`: argv holds what follows "doc".
 * Returns the exit status. */
int tern_doc_cmd(int argc, char **argv);

/* `tern chain gen|append|info|verify ...`: argv holds what follows
 * "chain". Returns the exit status. */
int tern_chain_cmd(int argc, char **argv);

#endif
