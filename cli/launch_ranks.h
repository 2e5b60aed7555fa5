// `train --gpus N`: the local launcher, torchrun-style (dist/distributed.h reads what
// it sets).
#pragma once

// Removes "--gpus N" from argv (argc updated) and returns N, or 0 when absent. Fatal
// for a value that is not an integer in [1, 64].
int take_gpus_arg(int *argc, char **argv);

// Starts N copies of this program as `train run ARGS...` (argv without --gpus), rank i
// with RANK=i WORLD_SIZE=N LOCAL_RANK=i LOCAL_WORLD_SIZE=N MASTER_ADDR=127.0.0.1 and a
// free MASTER_PORT, and waits for them. When one fails (an exit status other than 0 or a
// signal) the others get SIGTERM; a SIGTERM to the launcher goes to every rank (Ctrl-C
// reaches them from the terminal).
// Returns 0 when all succeeded, else the first failed rank's exit status (128 + signal),
// after a line naming that rank. Fatal when this process runs under a launcher itself.
int launch_local_ranks(int n, int argc, char **argv);
