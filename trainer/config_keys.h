// The run configuration's keys: one table from which the typed RunConfig (config.h), its
// defaults, range checks, resume checks, `train config` and docs/CONFIG.md all come.
// Regenerate the doc after an edit here: `build/train config --markdown > docs/CONFIG.md`
// (the `cli_config_doc` test fails while they differ).
//
// X(section, name, TYPE, default, min, max, flags, description)
//   TYPE: STR (a string; a NULL default also accepts null), INT, NUM (a real; integers
//   accepted), BOOL, LIST (a list of distinct non-empty strings, default empty).
//   min, max: the closed range of a numeric key (CFG_MIN_OPEN / CFG_MAX_OPEN exclude a
//   bound); ignored for the other types.
//   flags: CFG_FIXED (a resume may not change it: it decides the model, the data's tokens
//   or their order), CFG_LOCAL (where this run goes, not what it trains: never compared
//   on resume), CFG_MIN_OPEN, CFG_MAX_OPEN, CFG_NULLABLE (a STR key with a default that
//   also accepts null).
#pragma once
#include "model/lora.h"   // LORA_MAX_RANK
#include "model/model.h"  // MODEL_MAX_*: the model stage owns the model.* ranges

#define CFG_2P53 9007199254740992.0  // the largest integer a JSON double holds exactly
#define CFG_1G 1073741824.0

#define CONFIG_KEYS_TOP(X)                                                                        \
    X(, backend, STR, "auto", 0, 0, 0,                                                            \
      "auto, cpu or cuda; auto picks cuda when a GPU is visible")                                 \
    X(, out_dir, STR, "runs/strip_thinking", 0, 0, CFG_LOCAL,                                     \
      "the run's folder: run_config.json, metrics.jsonl, checkpoint-N/")                          \
    X(, seed, INT, 1234, 0, CFG_2P53, CFG_FIXED,                                                  \
      "seeds the initial weights and the data order")

#define CONFIG_KEYS_DATA(X)                                                                       \
    X(data, train_path, STR, "datasets/synthetic/train.jsonl", 0, 0, 0,                           \
      "JSONL of conversations to train on; a resume refuses a file with other bytes")            \
    X(data, eval_path, STR, "datasets/synthetic/eval.jsonl", 0, 0, CFG_NULLABLE,                  \
      "JSONL of conversations for the eval loss (in the inference view) and accuracy; null: "    \
      "data.eval_holdout of data.train_path")                                                   \
    X(data, eval_holdout, NUM, 0.01, 0, 0.5, CFG_FIXED,                                           \
      "with data.eval_path null: the share of data.train_path's conversations held out of "      \
      "training for the eval (at least 1, at most 200, evenly spaced in file order); 0: no eval") \
    X(data, tokenizer, STR, "datasets/synthetic/tokenizer.model", 0, 0, 0,                        \
      "a SentencePiece .model, a tokenizer.json or a model folder holding one; default with "   \
      "model.init_from: that folder's")                                                         \
    X(data, tokenizer_override, BOOL, false, 0, 0, 0,                                            \
      "train with a data.tokenizer other than model.init_from's own (refused otherwise)")        \
    X(data, layout, STR, "duplicate", 0, 0, CFG_FIXED,                                            \
      "npass, mask_only (option a), duplicate (option b, exact), shared_prefix, as_rendered "      \
      "(one pass as the template renders it) or preserve (one pass, all thinking kept)")           \
    X(data, seq_len, INT, 1024, 1, 1 << 20, CFG_FIXED,                                            \
      "tokens per packed row; a conversation never splits, so it must fit one row")               \
    X(data, unpacked, BOOL, false, 0, 0, CFG_FIXED,                                               \
      "one document per row instead of first-fit-decreasing packing")                             \
    X(data, skip_bad, BOOL, false, 0, 0, CFG_FIXED,                                               \
      "skip and count malformed lines instead of refusing the file")                              \
    X(data, skip_too_long, BOOL, false, 0, 0, CFG_FIXED,                                          \
      "skip and count samples longer than data.seq_len instead of refusing them")                 \
    X(data, stats_block, INT, 64, 1, 4096, 0,                                                     \
      "tile size of the mask statistics `train pack` prints")                                     \
    X(data, special_in_text, STR, "plain", 0, 0, 0,                                               \
      "plain: control-token text in the data trains as text; error: refuse such a line")          \
    X(data, ignore_unknown_keys, BOOL, false, 0, 0, CFG_FIXED,                                    \
      "count and report JSONL keys onepass does not read instead of refusing the line")           \
    X(data, max_line_bytes, INT, 0, 0, 1099511627776.0, CFG_FIXED,                                \
      "longest JSONL line parsed; 0: 64 x data.seq_len, at least 1 MiB")                          \
    X(data, train_on, STR, "think_answer", 0, 0, 0,                                               \
      "think_answer: reasoning and answer are targets; answer: only the answer")                  \
    X(data, skip_empty_think_turns, BOOL, false, 0, 0, 0,                                         \
      "a turn with absent or empty reasoning has no targets (still visible as history)")          \
    X(data, chat_template, STR, NULL, 0, 0, 0,                                                         \
      "chat template: qwen3, deepseek_r1, chatml, qwen2.5, smollm2, llama3, zephyr, onepass; "    \
      "null: detected from the model folder")                                                     \
    X(data, history_thinking, STR, "strip", 0, 0, CFG_FIXED,                                      \
      "earlier turns' reasoning in later views: strip (as every template renders by default) "    \
      "or keep (onepass; every layout is then one causal pass)")

#define CONFIG_KEYS_MODEL(X)                                                                      \
    X(model, vocab_size, INT, 512, 1, MODEL_MAX_VOCAB_SIZE, CFG_FIXED,                            \
      "vocabulary rows of the embedding (and LM head); not set: the tokenizer's size "           \
      "(model.init_from: its config.json's)")                                                     \
    X(model, hidden_size, INT, 128, 1, MODEL_MAX_HIDDEN_SIZE, CFG_FIXED,                          \
      "width of the residual stream")                                                             \
    X(model, intermediate_size, INT, 384, 1, MODEL_MAX_INTERMEDIATE_SIZE, CFG_FIXED,              \
      "width of the SwiGLU MLP")                                                                  \
    X(model, num_hidden_layers, INT, 4, 1, MODEL_MAX_LAYERS, CFG_FIXED, "transformer layers")     \
    X(model, num_attention_heads, INT, 2, 1, MODEL_MAX_HEADS, CFG_FIXED, "query heads")           \
    X(model, num_key_value_heads, INT, 1, 1, MODEL_MAX_HEADS, CFG_FIXED,                          \
      "key/value heads (GQA: divides num_attention_heads)")                                       \
    X(model, rms_norm_eps, NUM, 1e-5, 0, MODEL_MAX_RMS_NORM_EPS, CFG_FIXED | CFG_MIN_OPEN,        \
      "RMSNorm epsilon")                                                                          \
    X(model, rope_theta, NUM, 10000.0, 0, MODEL_MAX_ROPE_THETA, CFG_FIXED | CFG_MIN_OPEN,         \
      "RoPE base frequency")                                                                      \
    X(model, tie_word_embeddings, BOOL, true, 0, 0, CFG_FIXED,                                    \
      "the LM head shares the embedding's weights")                                               \
    X(model, init_from, STR, NULL, 0, 0, CFG_FIXED,                                               \
      "a Hugging Face model folder to fine-tune (its config.json overrides model.*); "            \
      "a folder of config.json alone: its shape, random init; null: random init")                \
    X(model, add_tokens, LIST, , 0, 0, CFG_FIXED,                                                 \
      "template tokens the tokenizer lacks, added as new ids (rows start at the mean row)")

#define CONFIG_KEYS_TRAIN(X)                                                                      \
    X(train, steps, INT, 300, 1, CFG_1G, 0, "optimizer steps of the run")                         \
    X(train, epochs, NUM, 0.0, 0, 1000000, 0,                                                     \
      "passes over data.train_path to train, instead of train.steps (0: train.steps decides); "  \
      "the steps are counted before step 1")                                                      \
    X(train, tokens_per_step, INT, 2048, 1, 1 << 24, CFG_FIXED,                                   \
      "trained (target) tokens per optimizer step, over all micro-batches and ranks")             \
    X(train, micro_rows, INT, 4, 1, 1 << 16, 0,                                                   \
      "packed rows per forward/backward; a step runs as many micro-batches as it needs")          \
    X(train, lr, NUM, 0.003, 0, INFINITY, CFG_MAX_OPEN,                                           \
      "peak learning rate: linear warmup, then cosine to lr x min_lr_ratio at train.steps")       \
    X(train, min_lr_ratio, NUM, 0.1, 0, 1, 0, "the cosine schedule's floor as a ratio of lr")     \
    X(train, warmup_steps, INT, 20, 0, CFG_1G, 0, "steps of linear warmup from 0 to lr")          \
    X(train, weight_decay, NUM, 0.1, 0, 100, 0, "AdamW decoupled weight decay")                   \
    X(train, beta1, NUM, 0.9, 0, 1, CFG_MAX_OPEN, "AdamW first-moment decay")                     \
    X(train, beta2, NUM, 0.95, 0, 1, CFG_MAX_OPEN, "AdamW second-moment decay")                   \
    X(train, eps, NUM, 1e-8, 0, 1, CFG_MIN_OPEN, "AdamW epsilon")                                 \
    X(train, grad_clip, NUM, 1.0, 0, INFINITY, CFG_MAX_OPEN,                                      \
      "global gradient-norm clip; 0: no clipping")                                                \
    X(train, decay_norms, BOOL, false, 0, 0, 0, "apply weight decay to RMSNorm weights too")       \
    X(train, decay_embeddings, BOOL, false, 0, 0, 0,                                              \
      "apply weight decay to the embedding (and untied LM head) too")                             \
    X(train, checkpoint_every, INT, 100, 0, CFG_1G, 0,                                            \
      "steps between checkpoints (and one at the end); 0: only at the end")                       \
    X(train, save_total_limit, INT, 0, 0, CFG_1G, 0,                                              \
      "checkpoints kept in out_dir: after each save the oldest beyond it are removed; 0: all")    \
    X(train, save_dtype, STR, NULL, 0, 0, 0,                                                      \
      "checkpoint weight dtype: bf16, f16 or f32; null: bf16 with model.init_from, else f32")     \
    X(train, resume, STR, NULL, 0, 0, CFG_LOCAL,                                                  \
      "a checkpoint folder to continue from, bit for bit, or latest (out_dir's newest); "       \
      "without --config the checkpoint's own config, changed only by the --set keys")            \
    X(train, overwrite, BOOL, false, 0, 0, CFG_LOCAL,                                             \
      "allow a new run into an out_dir that holds another run")                                   \
    X(train, deterministic, BOOL, true, 0, 0, 0,                                                  \
      "bitwise reproducible CUDA attention backward (fixed-point dQ)")                            \
    X(train, recompute, STR, "mlp", 0, 0, 0,                                                      \
      "what the backward recomputes instead of keeping: none, mlp (the MLP's gate|up) or "        \
      "layer (each layer's forward from its input); the same gradients in each")                 \
    X(train, offload_optimizer, BOOL, false, 0, 0, 0,                                             \
      "cuda: the fp32 master weights and AdamW m, v in pinned host memory, AdamW on the host's "  \
      "cores (12 bytes per parameter of host memory, 10 fewer on the device); the same bits")     \
    X(train, offload_activations, BOOL, false, 0, 0, 0,                                           \
      "cuda, with train.recompute=layer: the layer inputs the backward starts from in pinned "    \
      "host memory, copied behind the compute (3 of them on the device); the same bits")          \
    X(train, shuffle, BOOL, true, 0, 0, CFG_FIXED, "shuffle the conversations each epoch")         \
    X(train, peak_tflops, NUM, 0.0, 0, 1e7, 0,                                                    \
      "the MFU denominator in TFLOP/s; 0: the H200's dense bf16 peak on cuda, no MFU on cpu")

#define CONFIG_KEYS_LORA(X)                                                                       \
    X(lora, r, INT, 0, 0, LORA_MAX_RANK, CFG_FIXED,                                               \
      "LoRA rank: adapters A [r, in], B [out, r] on the lora.targets of a frozen "                \
      "model.init_from; 0: full fine-tuning")                                                     \
    X(lora, alpha, NUM, 32.0, 0, 1e6, CFG_FIXED | CFG_MIN_OPEN,                                   \
      "lora_alpha: the adapter's output is scaled by alpha / r (alpha / sqrt(r) under "          \
      "lora.rslora)")                                                                             \
    X(lora, targets, LIST, , 0, 0, CFG_FIXED,                                                     \
      "projections with an adapter, of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "     \
      "down_proj; empty: all seven")                                                              \
    X(lora, rslora, BOOL, false, 0, 0, CFG_FIXED, "scale by alpha / sqrt(r) (PEFT's use_rslora)") \
    X(lora, init_from, STR, NULL, 0, 0, CFG_FIXED,                                                \
      "a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) to start the "     \
      "adapters from; its r, lora_alpha, target_modules and use_rslora must be the lora.* keys'")

#define CONFIG_KEYS_EVAL(X)                                                                       \
    X(eval, every, INT, 50, 0, CFG_1G, 0, "steps between evals of data.eval_path; 0: never")       \
    X(eval, max_conversations, INT, 32, 0, CFG_1G, 0,                                             \
      "conversations of data.eval_path in the eval loss; 0: all of them")                                 \
    X(eval, generate_conversations, INT, 0, 0, CFG_1G, 0,                                         \
      "conversations whose answers are generated and scored at each eval; 0: off")

#define CONFIG_KEYS_DIST(X)                                                                       \
    X(dist, rendezvous_file, STR, NULL, 0, 0, CFG_LOCAL,                                          \
      "a path every rank sees, to exchange NCCL's id instead of MASTER_ADDR:MASTER_PORT")         \
    X(dist, bucket_mb, INT, 25, 1, 4096, 0, "MiB per gradient all-reduce bucket")                 \
    X(dist, timeout_s, NUM, 1800, 0, 1e6, CFG_MIN_OPEN,                                           \
      "seconds a rank waits for a silent peer before failing")

#define CONFIG_KEYS_GENERATE(X)                                                                   \
    X(generate, max_new_tokens, INT, 384, 1, 1 << 20, 0, "tokens generated per prompt at most")   \
    X(generate, temperature, NUM, 0.0, 0, 100, 0, "0: greedy (lowest id on ties)")                 \
    X(generate, top_p, NUM, 1.0, 0, 1, CFG_MIN_OPEN, "nucleus sampling mass")                     \
    X(generate, seed, INT, 0, 0, CFG_2P53, 0,                                                     \
      "prompt i draws from (seed, i), whatever the batching")                                     \
    X(generate, batch, INT, 32, 1, 1 << 16, 0, "sequences decoded at once")

#define CONFIG_KEYS_PARITY(X)                                                                     \
    X(parity, conversations, INT, 16, 1, 1 << 20, 0,                                              \
      "conversations of data.train_path compared across layouts")                                 \
    X(parity, weights, STR, NULL, 0, 0, 0,                                                        \
      "a model folder or model.safetensors to compare with; null: model.init_from or the init")

// Every key, in the order `train config` lists them.
#define CONFIG_KEYS(X)                                                                            \
    CONFIG_KEYS_TOP(X)                                                                            \
    CONFIG_KEYS_DATA(X)                                                                           \
    CONFIG_KEYS_MODEL(X)                                                                          \
    CONFIG_KEYS_TRAIN(X)                                                                          \
    CONFIG_KEYS_LORA(X)                                                                           \
    CONFIG_KEYS_EVAL(X)                                                                           \
    CONFIG_KEYS_DIST(X)                                                                           \
    CONFIG_KEYS_GENERATE(X)                                                                       \
    CONFIG_KEYS_PARITY(X)

// Keys that moved: the old spelling is refused naming the new one.
#define CONFIG_RENAMED(R)                                                                         \
    R("train.eval_every", "eval.every")                                                           \
    R("train.eval_max_conversations", "eval.max_conversations")                                   \
    R("train.rendezvous_file", "dist.rendezvous_file")                                            \
    R("train.bucket_mb", "dist.bucket_mb")                                                        \
    R("train.dist_timeout_s", "dist.timeout_s")                                                   \
    R("data.template", "data.chat_template")

// Keys replaced by a key of other values: the old one is refused naming the new key and
// how its values map.
#define CONFIG_REPLACED(R)                                                                        \
    R("train.keep_mlp_activations", "train.recompute", "true is none, false is mlp")              \
    R("train.lora", "lora.r", "the object's r, alpha, targets and rslora are the lora section's keys")
