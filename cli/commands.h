// The `train` subcommands. Each takes the argv after the subcommand name and
// returns the process exit code.
#pragma once

int cmd_train(int argc, char **argv);     // cli/cmd_train.c: the training run (default)
int cmd_pack(int argc, char **argv);      // cli/cmd_pack.c: pack rows, print statistics
int cmd_parity(int argc, char **argv);    // cli/cmd_parity.c: loss/gradient parity report
int cmd_show(int argc, char **argv);      // cli/cmd_show.c: draw the layouts' masks and tiles
int cmd_gen_data(int argc, char **argv);  // cli/cmd_gen_data.c: write the synthetic data sets
int cmd_tokenizer(int argc, char **argv); // cli/cmd_tokenizer.c: train a SentencePiece model
int cmd_export(int argc, char **argv);    // cli/cmd_export.c: a checkpoint as a HF folder
int cmd_generate(int argc, char **argv);  // cli/cmd_generate.c: continue conversations
int cmd_eval(int argc, char **argv);      // cli/cmd_eval.c: multi-turn accuracy
int cmd_config(int argc, char **argv);    // cli/cmd_config.c: the config keys, or a resolved config
int cmd_plot(int argc, char **argv);      // cli/cmd_plot.c: a run's curves as a PNG
int cmd_memory(int argc, char **argv);    // cli/cmd_memory.c: GPU and host memory per mode
