// `train run [--config FILE] [--set key=value]... [--gpus N]`: the training run
// (trainer/loop.h). --gpus N starts N local ranks (cli/launch_ranks.h); a first
// SIGINT/SIGTERM finishes the step, checkpoints and exits 0.
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/launch_ranks.h"
#include "dist/ranks.h"
#include "trainer/console_log.h"
#include "trainer/loop.h"
#include "trainer/setup.h"

static volatile sig_atomic_t stop_requested;

// First SIGINT/SIGTERM: finish the step, checkpoint, exit 0. SA_RESETHAND makes a
// second one kill the process at once.
static void on_stop_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void print_summary(const TrainRunResult *r) {
    if (r->first_step >= r->total_steps)
        printf("nothing to do: the checkpoint is at step %ld of train.steps %ld\n", r->first_step,
               r->total_steps);
    else if (r->steps_done == r->total_steps)
        printf("done: %ld steps in %.1f s; final weights in %s/\n", r->steps_done, r->elapsed_s,
               r->checkpoint_dir);
}

int cmd_train(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // progress lines interleave with errors in order
    const int gpus = take_gpus_arg(&argc, argv);
    if (gpus > 1) return launch_local_ranks(gpus, argc, argv);
    // Rank 0's console goes to out_dir/train.log too (trainer/console_log.h).
    const int rank = dist_env_from_environment().rank;
    char err[256];
    if (rank == 0 && console_log_begin(err, sizeof err) != 0) fprintf(stderr, "%s\n", err);
    RunConfig *config = config_from_args(argc, argv, "run", NULL, NULL);
    if (argc == 0)
        printf("train: no --config given: training the built-in defaults into out_dir '%s' "
               "(train --help lists the commands)\n", config->out_dir);
    TrainRun *run = train_run_start(config);
    install_stop_handlers();
    TrainRunResult result;
    train_run_steps(run, &stop_requested, &result);
    if (result.writes) print_summary(&result);
    train_run_free(run);
    config_free(config);
    return 0;
}
