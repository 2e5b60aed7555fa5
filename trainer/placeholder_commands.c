// Temporary: commands whose owners have not landed yet. Each owner deletes its
// line here when its real implementation lands.
#include "common/check.h"
#include "trainer/commands.h"

int cmd_train(int argc, char **argv) { (void)argc; (void)argv; fatal("train: not implemented yet"); }
int cmd_parity(int argc, char **argv) { (void)argc; (void)argv; fatal("parity: not implemented yet"); }
